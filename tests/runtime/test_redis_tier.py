"""The cluster tier on a real redis-server: shared between "nodes" (separate user caches),
written through to the user cache, checked before a load, never waited on when down, and read
by a user that may not write."""

from __future__ import annotations

import json

import pytest

from kdbkit.runtime.redis_link import redacted
from kdbkit.runtime import redis_tier
from kdbkit.runtime.redis_tier import PREFIX
from kdbkit.runtime.samples import SAMPLES
from tests.runtime.redis_server import READER_PASSWORD, free_port, server  # noqa: F401 (server: a fixture)

pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
RELU = SAMPLES[0]


@pytest.fixture
def node(isolated, make_handle, monkeypatch, server):
    """A handle of a "node": its own user cache, the shared cluster cache."""
    server.client().flushdb()
    count = iter(range(100))

    def make(url: str | None = None):
        monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(isolated / f"node{next(count)}"))
        monkeypatch.setenv("KDB_REMOTE_CACHE", url or server.url)
        monkeypatch.setenv("KDB_REMOTE_TIMEOUT_MS", "5000")  # a loaded CI machine: slow is not down
        return make_handle()
    make.env = monkeypatch.setenv
    return make


def _resolve(handle):
    return handle.program(RELU.kernel_file, RELU.options)


def test_a_program_compiled_on_one_node_is_a_remote_hit_on_another_then_a_local_one(node, isolated, monkeypatch):
    first = node()
    assert [t.name for t in first.sources] == ["system", "user", "remote", "jit"]
    assert _resolve(first).source == "jit"
    second = node()
    assert _resolve(second).source == "remote"
    second.chain.flush()  # written through in the background (the handle's close waits for it too)
    monkeypatch.setenv("KDB_REMOTE_CACHE", "")  # the same node again, without the cluster: its user cache has it
    from kdbkit.runtime.handle import Handle

    with Handle(backend=second.backend) as local:
        assert [t.name for t in local.sources] == ["system", "user", "jit"]
        assert _resolve(local).source == "user"


@pytest.mark.parametrize("planted", ["garbage", "a bare envelope", "another program's", "truncated", "oversized"])
def test_a_value_that_is_not_the_programs_is_refused_and_compiled_over(node, server, capfd, monkeypatch, planted):
    publisher = node()
    _resolve(publisher)
    client = server.client()
    (name,) = client.keys(PREFIX + "*")
    value = client.get(name)
    if planted == "another program's":  # another program's sealed entry under this key
        other = node()
        other.program(SAMPLES[1].kernel_file, SAMPLES[1].options)
        names = client.keys(PREFIX + "*")
        value = client.get(next(n for n in names if n != name))
    elif planted == "oversized":  # a real entry, but past the cap readers take
        monkeypatch.setattr(redis_tier, "MAX_ENTRY_BYTES", len(value) - 1)
    else:
        value = {"garbage": b"garbage", "a bare envelope": b"KDBTIER\x01" + b"0" * 200,
                 "truncated": value[:len(value) // 2]}[planted]
    client.set(name, value)
    program = _resolve(node())
    assert program.source == "jit" and any(s.name == "remote" and s.outcome == "refused" for s in program.steps)
    assert "Traceback" not in capfd.readouterr().err  # one warning per reason, once a process (warn_once)


def test_a_server_that_is_down_is_one_warning_and_the_jit_serves(node, capfd):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    handle = node(url)
    assert _resolve(handle).source == "jit"
    assert handle.program(SAMPLES[1].kernel_file, SAMPLES[1].options).source == "jit"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "cluster cache" in line]
    assert len(warnings) == 1 and "not answering" in warnings[0]


def test_a_read_only_user_gets_hits_and_publishes_nothing(node, server, capfd):
    _resolve(node())  # a builder (the default user) publishes
    reader = node(server.reader_url)
    assert _resolve(reader).source == "remote"
    assert reader.program(SAMPLES[1].kernel_file, SAMPLES[1].options).source == "jit"
    assert len(server.client().keys(PREFIX + "*")) == 1  # the reader's compile was not published
    err = capfd.readouterr().err
    assert "Traceback" not in err and "not answering" not in err and READER_PASSWORD not in err


def test_a_redis_url_not_understood_is_one_warning_without_its_password(isolated, make_handle, monkeypatch, capfd,
                                                                        fresh_log):
    monkeypatch.setenv("KDB_REMOTE_CACHE", "redis://:secret@[::1/0")
    make_handle()
    make_handle()
    warnings = [line for line in capfd.readouterr().err.splitlines() if "cluster cache" in line]
    assert len(warnings) == 1 and "KDB_REMOTE_CACHE is not a Redis URL" in warnings[0]
    assert "secret" not in warnings[0]


def test_passwords_never_appear_in_messages():
    assert redacted("redis://reader:s3cret@host:6379/0") == "redis://reader:***@host:6379/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"


@pytest.mark.parametrize("url", ["http://host/0", "redis://:secret@[::1/0"])
def test_a_remote_cache_setting_not_understood_and_the_job_runs(isolated, make_handle, monkeypatch, capfd,
                                                                          url):
    monkeypatch.setenv("KDB_REMOTE_CACHE", url)
    handle = make_handle()
    assert [t.name for t in handle.sources] == ["system", "user", "jit"]
    assert _resolve(handle).source == "jit"
    err = capfd.readouterr().err
    assert "secret" not in err and "Traceback" not in err  # the one warning (once a process) names no password


@pytest.mark.parametrize("policy, tiers", [("readonly", ["system", "user", "remote", "jit"]),
                                           ("off", ["system", "jit"]), ("installed-only", ["system", "jit"])])
def test_the_cache_policy_governs_the_cluster_cache_as_the_user_cache(node, server, monkeypatch, policy, tiers):
    monkeypatch.setenv("KDB_CACHE_POLICY", policy)
    handle = node()
    assert [t.name for t in handle.sources] == tiers
    if policy == "readonly":
        assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
        assert server.client().keys(PREFIX + "*") == []  # nothing published


def _remote_counts():
    from kdbkit.runtime import tier_stats

    return tier_stats.PROCESS.snapshot().get("remote", {})


def test_each_tier_is_counted_and_kdb_cache_stats_shows_it(node, server, isolated, monkeypatch, capsys):
    from kdbkit.runtime.cli.app import main

    before = _remote_counts()
    first = node()
    _resolve(first)  # a remote miss, a put
    second = node()
    _resolve(second)  # a remote hit
    client = server.client()
    (name,) = client.keys(PREFIX + "*")
    client.set(name, b"garbage")
    _resolve(node())  # a refusal
    after = _remote_counts()
    assert {k: after[k] - before.get(k, 0) for k in ("hits", "misses", "puts", "refusals")} == \
        {"hits": 1, "misses": 1, "puts": 2, "refusals": 1}  # the refused entry is compiled over and put again
    assert after["p50_ms"] is not None
    second.close()  # a handle's close saves what this process counted beside its user cache
    capsys.readouterr()
    assert main(["cache", "stats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tiers"]["remote"]["hits"] >= 1 and data["tiers"]["user"]["puts"] >= 1
    assert data["remote"]["programs"] == 1 and "maxmemory_policy" in data["remote"]


def test_kdb_cache_ls_and_clear_remote_with_and_without_the_right(node, server, monkeypatch, capsys):
    from kdbkit.runtime.cli.app import main

    _resolve(node())
    capsys.readouterr()
    assert main(["cache", "ls", "--remote", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["programs"] == 1
    monkeypatch.setenv("KDB_REMOTE_CACHE", server.reader_url)
    assert main(["cache", "clear", "--remote", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "write right" in err and "Traceback" not in err and "reader-secret" not in err
    assert len(server.client().keys(PREFIX + "*")) == 1
    monkeypatch.setenv("KDB_REMOTE_CACHE", server.url)
    assert main(["cache", "clear", "--remote", "--yes"]) == 0
    assert "removed 1 entr" in capsys.readouterr().out and server.client().keys(PREFIX + "*") == []
    monkeypatch.setenv("KDB_REMOTE_CACHE", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["cache", "ls", "--remote"]) == 1
    assert "does not answer" in capsys.readouterr().err


def test_doctor_says_whether_this_user_may_write(node, server, monkeypatch):
    from kdbkit.runtime.redis_tier import RedisTier

    for url, writable in ((server.url, "yes"), (server.reader_url, "no: read-only user")):
        tier = RedisTier(url)
        checks = {c.item: c.value for c in tier.checks()}
        tier.close()
        assert checks["reachable"] == "yes" and checks["writable"].startswith(writable)
        assert server.client().keys("kdb:probe:*") == []  # the probe leaves nothing behind


def test_readmes_acl_lines_give_jobs_reads_and_builders_leases_and_writes(node, server):
    from pathlib import Path

    from tests.runtime.redis_server import BUILDER_RIGHTS, READER_RIGHTS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"ACL SETUSER kdb-job on >PASSWORD {' '.join(READER_RIGHTS)}" in readme
    assert f"ACL SETUSER kdb-builder on >PASSWORD {' '.join(BUILDER_RIGHTS)}" in readme
    builder = node(server.builder_url)
    tier = next(t for t in builder.sources if t.name == "remote")
    assert tier.lease() is not None
    assert _resolve(builder).source == "jit" and tier.link.may_write
    assert server.client().keys("kdb:lease:*") == []  # taken, renewed by its token, released by it
    assert len(server.client().keys(PREFIX + "*")) == 1
    assert _resolve(node(server.reader_url)).source == "remote"


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_a_password_file_keeps_the_password_out_of_the_environment(node, server, isolated, capfd, fresh_log, mode):
    from tests.runtime.redis_server import READER

    _resolve(node())  # published by the default user
    secret = isolated / "redis-password"
    secret.write_text(READER_PASSWORD + "\n")
    secret.chmod(mode)
    node.env("KDB_REMOTE_PASSWORD_FILE", str(secret))
    reader = node(f"redis://{READER}@127.0.0.1:{server.port}/0")
    err = capfd.readouterr().err
    assert READER_PASSWORD not in err and "Traceback" not in err
    if mode == 0o600:
        assert _resolve(reader).source == "remote"
    else:  # others may read it: not a secret; one warning naming the fix, and the job runs without the cluster
        assert [t.name for t in reader.sources] == ["system", "user", "jit"]
        assert "open to other users" in err and f"chmod 600 {secret}" in err


def test_passwords_in_the_query_and_in_kdb_env_are_hidden(monkeypatch, capsys):
    from kdbkit.runtime.cli.app import main

    assert redacted("redis://host:6379/0?password=s3cret&db=1") == "redis://host:6379/0?password=***&db=1"
    assert "s3cret" not in redacted("redis://:s3cret@[::1/0")
    monkeypatch.setenv("KDB_REMOTE_CACHE", "redis://job:s3cret@cache:6379/0")
    assert main(["env", "--set", "--json"]) == 0
    assert "s3cret" not in capsys.readouterr().out


def test_a_listing_the_server_refuses_is_an_error_not_an_empty_cache(node, server, monkeypatch, capsys):
    from kdbkit.runtime.cli.app import main

    _resolve(node())
    server.client().execute_command("ACL", "SETUSER", "noscan", "on", ">noscan-secret", "~kdb:*", "-@all", "+get",
                                    "+ping", "+del")
    monkeypatch.setenv("KDB_REMOTE_CACHE", f"redis://noscan:noscan-secret@127.0.0.1:{server.port}/0")
    capsys.readouterr()
    assert main(["cache", "clear", "--remote", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "noscan-secret" not in err
    assert len(server.client().keys(PREFIX + "*")) == 1
