"""The runtime commands on the embedded default device (PoCL): resolve, devices, doctor, cache, demo."""

import json
import os

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
    assert [(s["step"], s["outcome"]) for s in first["handle_steps"]] == [  # no bundle: no sources digested up front
        ("open system bundle", "none"), ("open user cache", "none yet")]
    assert [(t["name"], t["writable"]) for t in first["sources"]] == [("system", False), ("user", True), ("jit", False)]
    assert first["sources"][1]["where"].endswith(".ukdb")
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


def test_the_missing_bundle_messages_name_the_file_kdb_build_writes(kdb, env, chain_device, monkeypatch, tmp_path):
    """Not ``<arch>_<cu>.kdb``: every program is CU-independent, so kdb build writes ``<arch>.kdb``."""
    from kdbkit.runtime import logging_setup

    calls = tmp_path / "calls.log"
    calls.write_text("activ,dir=fwd,mode=relu,type=fp32,shape=4x32x6x6,xs=1152x36x6x1,ys=1152x36x6x1,a=0.0,b=0.0,g=0.0\n")
    code, _, err = kdb("build", "--target", chain_device.target, "-c", calls, "-o", tmp_path / "built")
    assert code == 0, err
    (written,) = [p.name for p in (tmp_path / "built").iterdir() if p.suffix == ".kdb"]
    monkeypatch.setattr(logging_setup, "_once_keys", set())  # the warning is once per process
    logging_setup.configure_logging(force=True)
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    code, _, err = kdb("resolve", "activation.c", "-D", "KDB_DTYPE=float")
    assert code == 1 and f"Missing system database file: {written} Performance" in err
    assert f"({written} missing)" in err and f"install the bundle {written} " in err
    if chain_device.target.cu is not None:
        assert chain_device.target.bundle_name() not in err
    code, out, _ = kdb("devices", "--json")
    assert json.loads(out)[0]["wanted"] == written == chain_device.target.built_bundle_name()


def test_doctor_reports_every_section(kdb, env):
    code, out, _ = kdb("doctor", "--json")
    sections = {r["section"] for r in json.loads(out)}
    assert code == 0 and {"versions", "compilers", "system bundles", "devices", "user cache"} <= sections
    chain = [r["item"] for r in json.loads(out) if r["section"] == "cache sources"]
    assert chain == ["chain", "system", "user", "jit"]  # each tier as it describes itself


def test_cache_commands(kdb, env):
    kdb("resolve", "activation.c")
    code, out, _ = kdb("cache", "ls", "--json")
    files = json.loads(out)
    assert code == 0 and len(files) == 1 and files[0]["entries"] == 1
    code, out, _ = kdb("cache", "stats", "--json")
    assert json.loads(out)["entries"] == 1 and json.loads(out)["max_bytes_per_file"] == 4 << 30
    aside = env / "cache" / (files[0]["path"].rsplit("/", 1)[1] + ".corrupt-1")
    aside.write_bytes(b"old damaged file")
    os.utime(aside, (0, 0))  # prune keeps a moved-aside file a day, for a look at what went wrong
    code, out, _ = kdb("cache", "prune")
    assert code == 0 and not aside.exists() and "removed 1 file" in out
    assert open_bundle(files[0]["path"]).count() == 1
    code, out, _ = kdb("cache", "clear", "--yes")
    assert code == 0 and "removed 1 entr(ies)" in out
    assert open_bundle(files[0]["path"]).count() == 0  # emptied through SQLite; the file stays for its readers


def test_demo_is_the_main_job(kdb, env, tmp_path, chain_device):
    before = dict(os.environ)
    code, out, err = kdb("demo", "--workdir", tmp_path / "demo")
    assert code == 0, err
    # kdb may run inside a caller's process: the driver caches it turned off are back as they were
    # (POCL_KERNEL_CACHE=0 left behind made later racing processes crash inside PoCL)
    assert dict(os.environ) == before
    assert "all results match NumPy" in out
    if "Portable Computing Language" in chain_device.driver:  # the bundle run with PoCL's cache cold, then warm
        assert "ms was PoCL's own compile of the loaded binaries" in out and "with it warm" in out
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    assert len(rows) == 2 and "│ jit " in rows[0] and "│ system " in rows[1]  # JIT first, then only the bundle
    (built,) = (tmp_path / "demo" / "bundles").glob("*.kdb")
    assert (tmp_path / "demo" / "db" / built.name).read_bytes() == built.read_bytes()  # installed as built
    # the bundle pass compiles and caches no kernel (its folder holds at most the startup memo)
    assert list((tmp_path / "demo" / "cache-jit").glob("*.ukdb")) and not list((tmp_path / "demo").glob("cache-bundle/*.ukdb"))


# -- doctor ------------------------------------------------------------------------------------


def _rows(out):
    return {(r["section"], r["item"]): r for r in json.loads(out)}


def test_doctor_exits_1_when_it_finds_a_problem(kdb, env, monkeypatch):
    blocker = env / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(blocker / "cache"))
    code, out, _ = kdb("doctor", "--json")
    row = _rows(out)[("user cache", "writable")]
    assert code == 1 and row["ok"] is False and row["value"].startswith("NO")
    assert "is a file" in row["value"]  # a folder under a regular file can never be made
    code, out, _ = kdb("doctor")
    assert code == 1 and "problem(s)" in out


def test_doctor_knows_a_bundle_file_named_in_the_search_path(kdb, env, monkeypatch):
    from kdbkit.kdb import Target, write_bundle

    path = write_bundle(env / "mine.kdb", Target.parse("sm_90_132"), [("k.c.o", "-x", b"y" * 100)],
                        compiler="nvrtc 13.0", binary_format="cubin")
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(path))
    code, out, _ = kdb("doctor", "--json")
    row = _rows(out)[("system bundles", f"{path} (KDB_SYSTEM_DB_PATH)")]
    assert row["ok"] and row["value"] == "bundle file for sm_90_132"
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(env / "nowhere"))
    code, out, _ = kdb("doctor", "--json")
    assert code == 1 and _rows(out)[("system bundles", f"{env / 'nowhere'} (KDB_SYSTEM_DB_PATH)")]["ok"] is False


def test_a_bundle_file_in_the_search_path_serves_its_device(env, monkeypatch, chain_device):
    from kdbkit.packager.device_build import build_bundle
    from kdbkit.runtime.handle import Handle

    path = build_bundle(chain_device.target, [("activation.c", "-DKDB_DTYPE=float")], env,
                        file_name="my-kernels.kdb")
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(path))
    with Handle(chain_device) as handle:
        assert handle.program("activation.c", "-DKDB_DTYPE=float").source == "system"
        assert [c.status for c in handle.system_trace] == ["accepted"]


# -- devices -----------------------------------------------------------------------------------


def test_devices_says_what_kdb_backend_hides(kdb, env, monkeypatch, chain_device):
    other = "cuda" if chain_device.backend != "cuda" else "hip"
    monkeypatch.setenv("KDB_BACKEND", other)
    code, _, err = kdb("devices")
    assert code == 1 and f"KDB_BACKEND={other} hides" in err and f"unset KDB_BACKEND or add {chain_device.backend}" in err


# -- demo --------------------------------------------------------------------------------------


def test_demo_failure_is_one_line_and_leaves_no_temporary_folder(kdb, env, monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")  # the JIT run cannot compile: it must fail, in one line
    code, _, err = kdb("demo")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(errors) == 1 and "unset KDB_DISABLE_JIT" in errors[0]
    assert "Traceback" not in err and "File \"" not in err
    assert list((tmp_path / "tmp").iterdir()) == []  # nothing left behind


def test_demo_with_only_the_base_install_says_what_to_install(tmp_path):
    import subprocess
    import sys

    blocked = ("pyopencl", "cuda", "hip", "amdsmi", "pynvml")
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            f"    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {blocked!r}: raise ImportError(name + ' is not installed')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from kdbkit.runtime.cli.app import main\n"
            "sys.exit(main(['demo']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={k: v for k, v in __import__("os").environ.items() if not k.startswith("KDB_")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: no GPU and no OpenCL device found") and "pip install 'kdbkit[opencl]'" in line
