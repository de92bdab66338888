"""``kdb build --publish``: what a build makes for the local PoCL device reaches a real
redis-server keyed as a node keys it, so a fresh node (an empty user cache, JIT forbidden) gets
every program from the cluster cache; a read-only user, a server that is down, a server that
stops mid-way and an entry too large each leave the build whole and are said; a destination
that is no Redis URL, or no redis client, is a usage error before anything compiles."""

from __future__ import annotations

import json
import sys

import pytest

from kdbkit.packager import build_bundles
from kdbkit.packager import publish as publishing
from kdbkit.packager.build import plan
from kdbkit.packager.catalogue import read_catalogue
from kdbkit.runtime.redis_tier import PREFIX
from tests.runtime.chain_fixtures import chain_backend, chain_device, isolated, make_handle  # noqa: F401
from tests.runtime.redis_server import READER_PASSWORD, free_port, server  # noqa: F401 (server: a fixture)

pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
CATALOGUE = ("softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,"
             "a=1.0,b=0.0\nkdb driver activ -n 2 -c 4 -H 4 -W 4 -F 1\n")


@pytest.fixture
def cache(server):
    """The cluster cache, empty."""
    client = server.client()
    client.flushdb()
    return client


@pytest.fixture
def catalogue(isolated):
    path = isolated / "model.txt"
    path.write_text(CATALOGUE)
    return path


def _build(kdb, chain_device, catalogue, out, url, *more):  # noqa: F811
    return kdb("build", "--target", chain_device.target, "-c", catalogue, "-o", out, "--publish", url, *more)


def test_a_published_build_serves_a_fresh_node_with_no_compile(  # noqa: F811
        kdb, chain_device, catalogue, cache, server, isolated, make_handle, monkeypatch):
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", server.url, "--json")
    report = json.loads(out)
    assert code == 0 and report["compiled"] == 2 and not report["failed"], err
    arch = chain_device.target.full_arch
    assert report["published"]["published"] == 2 and report["published"]["not_published"] == {}
    (serves,) = report["published"]["serves"]
    assert serves["arch"] == arch and serves["programs"] == 2
    assert len(cache.keys(PREFIX + "*")) == 2  # one entry per program built
    # A node: its own empty user cache, no bundle installed, the jobs' read-only user, no JIT.
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(isolated / "node"))
    monkeypatch.setenv("KDB_REMOTE_CACHE", server.reader_url)
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    node = make_handle()
    assert serves["compiler"] == node.compiler.identity()
    jobs, _ = plan([chain_device.target], read_catalogue(catalogue).problems)
    for job in jobs:
        assert node.program(job.request.kernel_file, job.request.options).source == "remote"
    assert dict(node.chain.resolved) == {"remote": 2}


def test_programs_already_built_are_published_too(chain_device, catalogue, cache, server, isolated):  # noqa: F811
    first = build_bundles([chain_device.target], catalogues=[catalogue], out=isolated / "out")
    assert first.published is None and first.result.compiled == 2 and cache.keys(PREFIX + "*") == []
    again = build_bundles([chain_device.target], catalogues=[catalogue], out=isolated / "out", publish=server.url)
    assert (again.result.compiled, again.result.reused) == (0, 2)
    assert again.published.published == 2 and len(cache.keys(PREFIX + "*")) == 2


def test_a_read_only_user_builds_and_is_told_nothing_was_published(  # noqa: F811
        kdb, chain_device, catalogue, cache, server, isolated):
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", server.reader_url)
    assert code == 0 and "2 compiled" in out, err
    assert (isolated / "out" / chain_device.target.built_bundle_name()).exists()
    assert f"0 programs published to redis://reader:***@127.0.0.1:{server.port}/0" in out
    (line,) = [line for line in err.splitlines() if "not published" in line]
    assert "not published 2 programs" in line and "read-only user" in line
    assert READER_PASSWORD not in out + err and cache.keys(PREFIX + "*") == []


def test_a_server_that_is_down_is_one_line_and_the_bundle_is_written(  # noqa: F811
        kdb, chain_device, catalogue, isolated):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", url, "--json")
    assert code == 0 and json.loads(out)["compiled"] == 2, err
    assert (isolated / "out" / chain_device.target.built_bundle_name()).exists()
    assert json.loads(out)["published"]["published"] == 0
    (line,) = [line for line in err.splitlines() if "not answering" in line or "not published" in line]
    assert "not published 2 programs" in line and "the server is not answering" in line
    assert "Traceback" not in err


def test_a_server_that_stops_mid_way_is_one_warning_and_counted(  # noqa: F811
        chain_device, catalogue, isolated, monkeypatch, capfd, fresh_log):
    monkeypatch.setattr(publishing, "_cannot_write", lambda tier: None)  # it answered when asked, then stopped
    url = f"redis://127.0.0.1:{free_port()}/0"
    report = build_bundles([chain_device.target], catalogues=[catalogue], out=isolated / "out", publish=url)
    assert report.ok and report.published.published == 0
    assert report.published.not_published == {publishing.STOPPED: 2}
    warnings = [line for line in capfd.readouterr().err.splitlines() if "cluster cache" in line]
    assert len(warnings) == 1 and "not answering" in warnings[0]


def test_an_entry_too_large_for_the_cluster_cache_is_counted(  # noqa: F811
        chain_device, catalogue, cache, server, isolated, monkeypatch):
    monkeypatch.setattr("kdbkit.runtime.redis_tier.MAX_ENTRY_BYTES", 10)
    report = build_bundles([chain_device.target], catalogues=[catalogue], out=isolated / "out", publish=server.url)
    assert report.ok and report.published.not_published == {publishing.TOO_LARGE: 2}
    assert cache.keys(PREFIX + "*") == []


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:6379/0", "http://127.0.0.1:6379/0 is not a Redis URL to publish to"),
    ("127.0.0.1:6379", "127.0.0.1:6379 is not a Redis URL to publish to"),
    ("redis://:secret@[::1/0", "the URL to publish to does not parse"),
])
def test_a_destination_that_is_no_redis_url_is_a_usage_error_before_building(  # noqa: F811
        kdb, chain_device, catalogue, isolated, url, message):
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", url)
    text = " ".join(err.split())
    assert code == 2 and "--publish" in text and message in text and "redis://[user:password@]host:port/db" in text
    assert "secret" not in text and not (isolated / "out").exists()


def test_no_redis_client_is_a_usage_error_naming_the_extra(  # noqa: F811
        kdb, chain_device, catalogue, isolated, monkeypatch, server):
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", server.url)
    assert code == 2 and "pip install 'kdbkit[cluster]'" in " ".join(err.split())
    assert not (isolated / "out").exists()


def test_a_builder_that_trusts_keys_but_cannot_sign_publishes_nothing_and_says_so(  # noqa: F811
        kdb, chain_device, catalogue, cache, server, isolated, monkeypatch):
    from kdbkit.kdb.signing import write_key_pair

    _, public, _ = write_key_pair(isolated / "keys")
    monkeypatch.setenv("KDB_REMOTE_TRUSTED_KEYS", str(public))  # and no KDB_REMOTE_SIGNING_KEY
    code, out, err = _build(kdb, chain_device, catalogue, isolated / "out", server.url)
    assert code == 0 and (isolated / "out" / chain_device.target.built_bundle_name()).exists(), err
    (line,) = [line for line in err.splitlines() if "not published" in line]
    assert "not published 2 programs" in line and "KDB_REMOTE_SIGNING_KEY" in line
    assert cache.keys(PREFIX + "*") == []
