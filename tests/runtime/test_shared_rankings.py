"""Find once per cluster, on a real redis-server: a ranking found on one "node" (its own user
cache and find-db) is chosen by immediate mode on another without timing anything and written
through to its user find-db; what the server returns is checked before it chooses anything; a
read-only user and KDB_CACHE_POLICY=readonly publish nothing; an outage is one warning."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from kdbkit.kdb.find_db import FindDb, FindRecord
from kdbkit.runtime import keyed_tier, shared_rankings
from kdbkit.runtime.find import find_solutions, recorded_solutions
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.activation import ActivationMode, ActivationProblem
from kdbkit.runtime.shared_rankings import PREFIX, encode, ranking_digest, registry_version
from kdbkit.runtime.tensor import DataType
from tests.runtime.chain_fixtures import child_env
from tests.runtime.redis_server import READER_PASSWORD, free_port, server  # noqa: F401 (server: a fixture)

pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
PACKED = ActivationProblem("fwd", ActivationMode.GELU_ERF, DataType.FP32, (64, 33), (33, 1), (33, 1))
STRIDED = ActivationProblem("fwd", ActivationMode.RELU, DataType.FP32, (4, 5), (8, 1), (5, 1))
# ActivPacked (1) is the heuristic's first choice for PACKED: a ranking putting ActivStrided (2)
# first shows that immediate mode followed the ranking.
STRIDED_FIRST = [FindRecord(2, "ActivStrided", 0, 0.1, 0), FindRecord(1, "ActivPacked", 1, 0.2, 0)]


@pytest.fixture
def node(isolated, make_handle, monkeypatch, server, fresh_log):
    """A handle of a "node": its own user cache and user find-db, the shared cluster cache."""
    server.client().flushdb()
    count = iter(range(100))

    def make(url: str | None = None):
        at = isolated / f"node{next(count)}"
        monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(at / "cache"))
        monkeypatch.setenv("KDB_USER_DB_PATH", str(at / "userdb"))
        monkeypatch.setenv("KDB_REMOTE_CACHE", url or server.url)
        monkeypatch.setenv("KDB_REMOTE_TIMEOUT_MS", "5000")  # a loaded CI machine: slow is not down
        handle = make_handle()
        handle.find_db  # noqa: B018 - opened now, in this node's folder (the next node changes the setting)
        return handle
    return make


def _rank_names(server) -> list[bytes]:
    return server.client().keys(PREFIX + "*")


def _digest(handle, problem) -> str:
    return ranking_digest(primitive=problem.primitive, config=problem.config(), target=handle.find_db.user_path.stem,
                          registry=registry_version(problem.primitive))


def _plant(server, handle, problem, payload: bytes, digest: str | None = None) -> None:
    """``payload`` sealed (under ``digest``, by default the problem's own) at the problem's key."""
    server.client().set(PREFIX + _digest(handle, problem), keyed_tier.seal(digest or _digest(handle, problem), payload))


def _ranking(handle, problem, records) -> bytes:
    return encode(problem.config(), handle.find_db.user_path.stem, registry_version(problem.primitive), records)


def _user_rows(handle, problem) -> list[tuple]:
    if not handle.find_db.user_path.exists():
        return []
    with sqlite3.connect(handle.find_db.user_path) as conn:
        return conn.execute("SELECT solver, rank FROM find_db WHERE config = ? ORDER BY rank",
                            (problem.config(),)).fetchall()


def _no_timing(monkeypatch, handle) -> None:
    monkeypatch.setattr(type(handle.backend), "time_ms", lambda *a, **k: pytest.fail("find timed again"))


def test_a_ranking_found_on_one_node_is_chosen_on_another_and_written_through(node, server, monkeypatch):
    first = node()
    found = find_solutions(first, PACKED)
    assert first.dispatcher.shared.published == 1 and len(_rank_names(server)) == 1
    second = node()
    _no_timing(monkeypatch, second)
    choice = choose(second, PACKED)
    assert choice.how == "find-db" and choice.solver.name == found[0].solver
    assert choice.trace == (f"{found[0].solver}: ranked first by the find-db (cluster)",)
    assert _user_rows(second, PACKED) == [(s.solver, rank) for rank, s in enumerate(found)]  # written through
    again = find_solutions(second, PACKED)  # find too takes the shared ranking: it times nothing
    assert [(s.solver, s.time_ms) for s in again] == [(s.solver, s.time_ms) for s in found]
    assert {s.source for s in again} == {"user"}  # the written-through copy: the cluster was asked once
    assert second.dispatcher.shared.hits == 1


def test_the_user_find_db_comes_before_the_cluster_and_the_cluster_before_the_system_find_db(node, server, isolated):
    handle = node()
    target = handle.find_db.user_path.stem
    system = FindDb(target, [], isolated / "shipped", producer="test", warn=print)
    system.store(PACKED.config(), [FindRecord(1, "ActivPacked", 0, 0.5, 0)])
    system.close()
    (isolated / "shipped" / f"{target}.ufdb").rename(isolated / "system" / f"{target}.fdb")
    assert [s.solver for s in recorded_solutions(handle, PACKED)] == ["ActivPacked"]  # the shipped one, alone
    _plant(server, handle, PACKED, _ranking(handle, PACKED, STRIDED_FIRST))
    reader = node()
    assert [(s.solver, s.source) for s in recorded_solutions(reader, PACKED)][0] == ("ActivStrided", "cluster")
    mine = node()
    mine.find_db.store(PACKED.config(), [FindRecord(1, "ActivPacked", 0, 0.1, 0)])
    assert [(s.solver, s.source) for s in recorded_solutions(mine, PACKED)] == [("ActivPacked", "user")]
    assert mine.dispatcher.shared.hits + mine.dispatcher.shared.misses == 0  # the cluster was not even asked


def test_a_shared_ranking_naming_a_solver_this_kdbkit_lacks_skips_it(node, server, caplog):
    handle = node()
    _plant(server, handle, PACKED, _ranking(handle, PACKED, [FindRecord(999, "GoneInAnUpgrade", 0, 0.05, 0),
                                                             *STRIDED_FIRST]))
    reader = node()
    with caplog.at_level("INFO", logger="kdbkit"):
        choice = choose(reader, PACKED)
    assert choice.how == "find-db" and choice.solver.name == "ActivStrided"
    assert "skipping solver GoneInAnUpgrade (999)" in caplog.text and "no such solver" in caplog.text


def _planted_values(handle, problem):
    """Values that are not ``problem``'s ranking, by what is wrong with them."""
    digest, target, registry = _digest(handle, problem), handle.find_db.user_path.stem, registry_version(problem.primitive)
    good = keyed_tier.seal(digest, _ranking(handle, problem, STRIDED_FIRST))

    def sealed(*rows, **fields) -> bytes:  # a payload of these rows (and fields), sealed under the problem's key
        payload = {"v": 1, "config": problem.config(), "target": target, "registry": registry, "records": rows}
        return keyed_tier.seal(digest, json.dumps({**payload, **fields}).encode())

    return {
        "garbage": b"garbage",
        "truncated": good[:-5],
        "another problem's ranking": keyed_tier.seal(_digest(handle, STRIDED), _ranking(handle, STRIDED, STRIDED_FIRST)),
        "another problem's payload under this key": sealed([2, "ActivStrided", 0, 0.1, 0], config=STRIDED.config()),
        "another target's payload under this key": sealed([2, "ActivStrided", 0, 0.1, 0], target=f"{target}_other"),  # never this device's
        "not JSON": keyed_tier.seal(digest, b"\xff\x00 not json"),
        "no records": sealed(),
        "NaN time": sealed([2, "ActivStrided", 0, float("nan"), 0]),
        "negative time": sealed([2, "ActivStrided", 0, -1.0, 0]),
        "ranks out of order": sealed([2, "ActivStrided", 1, 0.1, 0], [1, "ActivPacked", 0, 0.2, 0]),
        "a solver twice": sealed([2, "ActivStrided", 0, 0.1, 0], [2, "ActivStrided", 1, 0.2, 0]),
        "a huge workspace": sealed([2, "ActivStrided", 0, 0.1, 10 ** 20]),
        "a record of the wrong shape": sealed([2, "ActivStrided", 0, 0.1]),
        "too large": keyed_tier.seal(digest, b" " * (shared_rankings.MAX_PAYLOAD_BYTES + 1)),
        "too large to read": b"x" * (64 << 20),  # refused after reading one byte past the cap
    }


PLANTED = ["garbage", "truncated", "another problem's ranking", "another problem's payload under this key",
           "another target's payload under this key", "not JSON", "no records", "NaN time", "negative time",
           "ranks out of order", "a solver twice", "a huge workspace", "a record of the wrong shape", "too large",
           "too large to read"]


@pytest.mark.parametrize("what", PLANTED)
def test_a_value_that_is_not_the_problems_ranking_is_refused_and_counted(node, server, capfd, monkeypatch, what):
    handle = node()
    server.client().set(PREFIX + _digest(handle, PACKED), _planted_values(handle, PACKED)[what])
    reader = node()
    assert choose(reader, PACKED).how == "heuristic"
    assert reader.dispatcher.shared.refused == 1 and reader.dispatcher.shared.hits == 0
    assert _user_rows(reader, PACKED) == []  # nothing written through
    assert recorded_solutions(node(), PACKED) == []  # nor taken by the next reader
    err = capfd.readouterr().err
    assert err.count("refusing it") == 1 and "Traceback" not in err  # one warning per reason, once a process


def test_a_giant_value_is_refused_reading_no_more_than_one_byte_past_the_cap(node, server, monkeypatch):
    handle = node()
    server.client().set(PREFIX + _digest(handle, PACKED), b"x" * (8 << 20))
    reader = node()
    link, answers = reader.dispatcher.shared.link, []
    real_read = link.read
    monkeypatch.setattr(link, "read", lambda *a, **k: answers.append(real_read(*a, **k)) or answers[-1])
    assert choose(reader, PACKED).how == "heuristic" and reader.dispatcher.shared.refused == 1
    assert [len(a) for a in answers if isinstance(a, bytes)] == [shared_rankings.MAX_VALUE_BYTES + 1]


def test_a_read_only_user_reads_rankings_and_publishes_none(node, server, capfd):
    find_solutions(node(), PACKED)  # a trusted node (the default user) publishes
    reader = node(server.reader_url)
    assert choose(reader, PACKED).trace[0].endswith("(cluster)")
    find_solutions(reader, STRIDED)  # timed here, kept here, not published
    assert _user_rows(reader, STRIDED) and len(_rank_names(server)) == 1
    assert reader.dispatcher.shared.published == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "not answering" not in err and READER_PASSWORD not in err


def test_a_server_that_is_down_is_one_warning_and_find_works_as_without_it(node, capfd):
    handle = node(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    found = find_solutions(handle, PACKED)
    assert found and {s.source for s in found} == {"timed"}
    assert choose(handle, PACKED).trace[0].endswith("(user)")
    assert choose(handle, STRIDED).how == "heuristic"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "cluster cache" in line]
    assert len(warnings) == 1 and "not answering" in warnings[0]
    assert handle.dispatcher.shared.published == 0


def test_a_narrowed_find_is_kept_locally_and_not_shared(node, server, monkeypatch):
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", "ActivStrided")
    handle = node()
    assert [s.solver for s in find_solutions(handle, PACKED)] == ["ActivStrided"]
    assert _user_rows(handle, PACKED) == [("ActivStrided", 0)] and _rank_names(server) == []


@pytest.mark.parametrize("policy", ["readonly", "off", "installed-only"])
def test_the_cache_policy_governs_shared_rankings(node, server, monkeypatch, policy):
    writer = node()
    _plant(server, writer, PACKED, _ranking(writer, PACKED, STRIDED_FIRST))
    monkeypatch.setenv("KDB_CACHE_POLICY", policy)
    handle = node()
    choice = choose(handle, PACKED)
    if policy != "readonly":  # no cluster tier, so no shared rankings
        assert handle.dispatcher.shared is None and choice.how == "heuristic"
        return
    assert choice.trace[0] == "ActivStrided: ranked first by the find-db (cluster)"
    find_solutions(handle, STRIDED)  # read, never written
    assert len(_rank_names(server)) == 1 and handle.dispatcher.shared.published == 0


_NODE = """
import json, sys, kdbkit
from kdbkit.runtime.find import find_solutions
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.problem import parse_config
problem = parse_config(CONFIG)
with kdbkit.Handle() as h:
    real_time, timed = type(h.backend).time_ms, []
    type(h.backend).time_ms = lambda *a, **k: timed.append(1) or real_time(*a, **k)
    if sys.argv[1] == "find":
        print(json.dumps([s.solver for s in find_solutions(h, problem)]))
    else:
        choice = choose(h, problem)
        print(json.dumps({"trace": choice.trace, "timed": len(timed)}))
""".replace("CONFIG", repr(PACKED.config()))


def test_a_ranking_one_node_process_found_is_chosen_by_another_process(isolated, tmp_path, server, chain_device):
    server.client().flushdb()

    def run(name: str, what: str):
        env = child_env(tmp_path, KDB_REMOTE_CACHE=server.url, KDB_USER_DB_PATH=str(tmp_path / name / "userdb"))
        env["KDB_CUSTOM_CACHE_DIR"] = str(tmp_path / name / "cache")
        out = subprocess.run([sys.executable, "-c", _NODE, what], capture_output=True, text=True, env=env, check=True)
        assert "Traceback" not in out.stderr, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    ranked = run("a", "find")
    assert run("b", "choose") == {"trace": [f"{ranked[0]}: ranked first by the find-db (cluster)"], "timed": 0}
    assert len(_rank_names(server)) == 1


def test_without_a_cluster_nothing_of_it_is_imported(isolated, tmp_path, chain_device):
    child = """
import json, sys, kdbkit
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.problem import parse_config
with kdbkit.Handle() as h:
    choose(h, parse_config(CONFIG))
    print(json.dumps(sorted(m for m in ("redis", "kdbkit.runtime.redis_tier", "kdbkit.runtime.shared_rankings")
                            if m in sys.modules)))
""".replace("CONFIG", repr(PACKED.config()))
    env = child_env(tmp_path, KDB_USER_DB_PATH=str(tmp_path / "userdb"))
    env.pop("KDB_REMOTE_CACHE", None)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_field_of_the_key_changes_the_digest():
    base = dict(primitive="activ", config="c", target="sm_90_132", registry="r")
    digests = {ranking_digest(**base)} | {ranking_digest(**{**base, field: base[field] + "x"}) for field in base}
    assert len(digests) == 5 and all(len(d) == 64 for d in digests)
    # Length prefixes: text moved from one field into the next (across its label) is another key.
    assert (ranking_digest(**{**base, "config": "a", "target": "targetb"})
            != ranking_digest(**{**base, "config": "atarget", "target": "b"}))


def test_the_registry_version_follows_the_primitive_s_solvers():
    from kdbkit.runtime.solver import REGISTRY

    before = registry_version("activ")
    assert registry_version("activ") == before and registry_version("softmax") != before
    gone = REGISTRY.unregister(REGISTRY.for_primitive("activ")[-1].id)  # the last: registered again, it is last again
    try:
        assert registry_version("activ") != before
    finally:
        REGISTRY.register(gone)
    assert registry_version("activ") == before
