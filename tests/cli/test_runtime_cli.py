"""The runtime commands on the embedded default device (PoCL): resolve, devices, doctor, cache, demo."""

import json

import pytest

from kdbkit.kdb import open_bundle
from tests.runtime.chain_fixtures import chain_device, isolated  # noqa: F401


@pytest.fixture
def env(isolated, monkeypatch, chain_device):
    monkeypatch.setenv("KDB_BACKEND", chain_device.backend)
    return isolated


def test_resolve_reports_each_source(kdb, env):
    code, out, _ = kdb("resolve", "activation.c", "-D", "KDB_DTYPE=float", "--json")
    first = json.loads(out)
    assert code == 0 and first["source"] == "jit"
    assert [s["step"] for s in first["steps"]] == ["memory", "user", "jit", "load"]
    assert [(s["step"], s["outcome"]) for s in first["handle_steps"]][1:] == [
        ("open system bundle", "none"), ("open user cache", "none yet")]
    code, out, _ = kdb("resolve", "activation.c", "-D", "KDB_DTYPE=float", "--json")
    second = json.loads(out)
    assert second["source"] == "user" and [(s["step"], s["outcome"]) for s in second["steps"]][1:] == [
        ("user", "hit"), ("load", "loaded")]
    assert second["handle_steps"][-1]["outcome"] == "opened"
    code, out, _ = kdb("resolve", "activation.c", "-D", "KDB_DTYPE=float")
    assert code == 0 and "source: user" in out
    assert f"kernel: activation.c from {first['kernel_folder']}" in out


def test_resolve_errors_are_one_line(kdb, env, monkeypatch):
    code, _, err = kdb("resolve", "nope.c")
    assert code == 1 and "nope.c" in err and "Traceback" not in err
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    code, _, err = kdb("resolve", "activation.c", "-D", "SALT=cli")
    assert code == 1 and "KDB_DISABLE_JIT" in err
    code, _, err = kdb("resolve", "activation.c", "--device", "99")
    assert code == 1 and "no device 99" in err


def test_devices_names_the_bundle_each_would_use(kdb, env):
    code, out, _ = kdb("devices", "--json")
    rows = json.loads(out)
    assert code == 0 and rows and rows[0]["bundle"] is None and rows[0]["wanted"].endswith(".kdb")


def test_doctor_reports_every_section(kdb, env):
    code, out, _ = kdb("doctor", "--json")
    sections = {r["section"] for r in json.loads(out)}
    assert code == 0 and {"versions", "compilers", "system bundles", "devices", "user cache"} <= sections


def test_cache_commands(kdb, env):
    kdb("resolve", "activation.c")
    code, out, _ = kdb("cache", "ls", "--json")
    files = json.loads(out)
    assert code == 0 and len(files) == 1 and files[0]["entries"] == 1
    code, out, _ = kdb("cache", "stats", "--json")
    assert json.loads(out)["entries"] == 1
    aside = env / "cache" / (files[0]["path"].rsplit("/", 1)[1] + ".corrupt-1")
    aside.write_bytes(b"old damaged file")
    code, out, _ = kdb("cache", "prune")
    assert code == 0 and not aside.exists() and "removed 1 file" in out
    assert open_bundle(files[0]["path"]).count() == 1
    code, out, _ = kdb("cache", "clear", "--yes")
    assert code == 0 and "removed 1 entr(ies)" in out
    assert open_bundle(files[0]["path"]).count() == 0  # emptied through SQLite; the file stays for its readers


def test_demo_is_the_main_job(kdb, env, tmp_path):
    code, out, err = kdb("demo", "--cache-dir", tmp_path / "demo-cache")
    assert code == 0, err
    assert "all results match NumPy" in out
    lines = [line for line in out.splitlines() if line.startswith("│ ")]
    assert len(lines) == 3 and all("│ jit" in line and "│ user" in line for line in lines)
