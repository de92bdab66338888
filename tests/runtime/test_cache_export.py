"""``kdb cache export``: a JIT run's user cache and find-db become a bundle and a find-db that
verify, package and install, and that serve every program as a "system" hit with JIT off and an
empty user cache; edited sources, other compilers' entries and damaged entries are skipped with
their reason; bad input is one line and exit 1. On the chain device (PoCL on the CPU in CI)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import zipfile
from pathlib import Path

import pytest

from kdbkit.kdb import open_bundle
from kdbkit.kdb.find_db import read_rankings
from kdbkit.runtime.cache_export import export_cache
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.program_key import ProgramRequest, program_key
from tests.runtime import export_job
from tests.runtime.chain_fixtures import KDB_VARS_TO_CLEAR, isolated  # noqa: F401


@pytest.fixture(scope="module")
def warm(tmp_path_factory, chain_backend) -> dict:
    """One JIT run of the job, its cache and find-db kept to be copied by each test."""
    root = tmp_path_factory.mktemp("warm")
    (root / "system").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for var in (*KDB_VARS_TO_CLEAR, "KDB_KERNEL_PATH", "KDB_REMOTE_CACHE", "KDB_CACHE_SOURCES", "KDB_CACHE_POLICY"):
            mp.delenv(var, raising=False)
        mp.setenv("KDB_CUSTOM_CACHE_DIR", str(root / "cache"))
        mp.setenv("KDB_USER_DB_PATH", str(root / "userdb"))
        mp.setenv("KDB_SYSTEM_DB_PATH", str(root / "system"))
        with Handle(backend=chain_backend) as handle:
            ran = export_job.warm(handle)
    assert ran["ok"] and set(ran["resolved"]) == {"jit"}, ran
    return {"root": root, **ran}


@pytest.fixture
def cached(warm, isolated, monkeypatch) -> Path:
    """This test's own copy of the warm cache and find-db, where KDB_CUSTOM_CACHE_DIR and
    KDB_USER_DB_PATH point (isolated); the export goes to the returned folder."""
    for var in ("KDB_KERNEL_PATH", "KDB_REMOTE_CACHE", "KDB_CACHE_SOURCES", "KDB_CACHE_POLICY"):
        monkeypatch.delenv(var, raising=False)
    shutil.copytree(warm["root"] / "cache", isolated / "cache")
    shutil.copytree(warm["root"] / "userdb", isolated / "userdb")
    return isolated / "exported"


def _cache_file(isolated: Path) -> Path:
    (path,) = (isolated / "cache").glob("*.ukdb")
    return path


def _export(kdb, out: Path, *args) -> dict:
    code, stdout, stderr = kdb("cache", "export", "-o", out, "--json", *args)
    assert code == 0 and "Traceback" not in stderr, stderr
    return json.loads(stdout)


def test_an_export_packages_installs_and_serves_every_program_from_system_with_jit_off(
        kdb, warm, cached, isolated, monkeypatch, chain_backend):
    report = _export(kdb, cached)
    (done,) = report["targets"]
    entries = sum(1 for _ in open_bundle(_cache_file(isolated)).entries())
    assert report["skipped"] == [] and done["programs"] == entries > 0
    bundle, (find_db,) = Path(done["bundle"]), map(Path, done["find_dbs"])
    assert bundle.name == f"{warm['target'].rsplit('_', 1)[0]}.kdb" and find_db.name == f"{warm['target']}.fdb"
    with open_bundle(bundle) as b:  # as `kdb build` writes one: the compiler and the sources it was built from
        assert b.metadata.compiler == done["compiler"] == warm["compiler"]
        assert set(b.metadata.source_digests) == {e.kernel_name.removesuffix(".o") for e in b.entries()}
    assert export_job.RANKED.config() in read_rankings(find_db)

    code, out, _ = kdb("db", "verify", bundle)
    assert code == 0 and out.startswith("ok"), out
    code, out, err = kdb("package", bundle, "--find-db", find_db, "-o", isolated / "wheels", "--json")
    assert code == 0, err
    (wheel,) = map(Path, json.loads(out)["wheels"])
    # `kdb install` checks the wheel and chooses it for this device (pip would install it into this
    # environment: the slow test below installs it into a fresh one); laid out as pip would.
    code, out, err = kdb("install", "--from", isolated / "wheels", "--target", warm["target"], "--dry-run", "--json")
    (device,) = json.loads(out)["devices"]
    assert code == 0 and Path(device["chosen"]) == wheel, err
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(isolated / "site")
    (installed,) = [p for p in (isolated / "site").iterdir() if not p.name.endswith(".dist-info")]

    # A new handle, JIT off, an empty user cache and find-db: every program from "system".
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(installed))
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(isolated / "empty-cache"))
    monkeypatch.setenv("KDB_USER_DB_PATH", str(isolated / "empty-userdb"))
    monkeypatch.setenv("KDB_DISABLE_JIT", "1")
    with Handle(backend=chain_backend) as handle:
        ran = export_job.check(handle)
    assert ran["by_source"] == {"system": entries} and ran["resolved"] == {"system": entries}, ran
    assert ran["ok"] and ran["choice"] == "find-db" and ran["ranking"] == [str(installed / find_db.name)]
    assert not list((isolated / "empty-cache").glob("*.ukdb"))


def test_entries_of_an_edited_kernel_file_are_skipped_as_stale(kdb, cached, isolated, monkeypatch):
    from kdbkit.runtime import kernel_sources

    edited = isolated / "edited"  # found first on KDB_KERNEL_PATH, as a job's own kernel folder would be
    edited.mkdir()
    text = (kernel_sources.kernels_dir() / "reduce_sum.c").read_text()
    (edited / "reduce_sum.c").write_text(text + "\n/* edited after the run */\n")
    monkeypatch.setenv("KDB_KERNEL_PATH", str(edited))
    report = _export(kdb, cached)
    assert report["skipped_by_reason"] == {"stale": 1}
    (skipped,) = report["skipped"]
    assert skipped["kernel_name"] == "reduce_sum.c.o" and "reduce_sum.c as it is now" in skipped["detail"]
    with open_bundle(report["targets"][0]["bundle"]) as b:
        names = {e.kernel_name for e in b.entries()}
        assert "reduce_sum.c.o" not in names and "activation.c.o" in names
        assert "reduce_sum.c" not in b.metadata.source_digests

    code, out, _ = kdb("cache", "export", "-o", isolated / "again")  # the text says why, with the count
    assert code == 0 and "1 stale: its key does not match its kernel source as it is now" in out


def test_a_damaged_entry_is_skipped_and_the_bundle_verifies(kdb, cached, isolated):
    with sqlite3.connect(_cache_file(isolated)) as conn:  # bytes that no longer match their hash
        conn.execute("UPDATE kern_db SET kernel_blob = zeroblob(64), uncompressed_size = 0 "
                     "WHERE kernel_name = 'matmul_tiled.c.o'")
    report = _export(kdb, cached)
    assert report["skipped_by_reason"] == {"damaged": 1}
    assert report["skipped"][0]["kernel_name"] == "matmul_tiled.c.o"
    code, out, _ = kdb("db", "verify", report["targets"][0]["bundle"])
    assert code == 0 and out.startswith("ok")


def test_another_compiler_s_entries_are_skipped_and_the_bundle_records_the_one_with_most(cached, isolated):
    from kdbkit.kdb import Bundle
    from kdbkit.runtime.kernel_sources import source_digest

    cache = _cache_file(isolated)
    with Bundle.open(cache, writable=True, wal=True) as b:
        here, target = b.metadata.compiler, b.metadata.target
        digest = source_digest("activ.c")
        key = program_key(ProgramRequest("activ.c", "-DOLD=1"), target=target, compiler="pocl 0.9 (older)",
                          source_digest=digest)
        b.put(key.kernel_name, key.kernel_args, b"an older compiler's binary")
        entries = b.count()
    report = export_cache(cached, compilers=lambda t: [here, "pocl 0.9 (older)"])
    (done,) = report.targets
    assert done.compiler == here and done.by_compiler == {here: entries - 1, "pocl 0.9 (older)": 1}
    assert report.counts == {"other-compiler": 1} and report.skipped[0].kernel_args == key.kernel_args
    with open_bundle(done.bundle) as b:
        assert b.metadata.compiler == here and b.count() == entries - 1
    # A compiler known nowhere here: its entry's key cannot be made again, so it is stale.
    report = export_cache(isolated / "unknown", compilers=lambda t: [here])
    assert report.counts == {"stale": 1}


def test_entries_of_a_file_off_the_search_path_or_not_keyed_by_kdbkit_are_skipped(cached, isolated):
    from kdbkit.kdb import Bundle

    with Bundle.open(_cache_file(isolated), writable=True, wal=True) as b:
        target, here = b.metadata.target, b.metadata.compiler
        gone = program_key(ProgramRequest("gone.c"), target=target, compiler=here, source_digest="ab" * 32)
        b.put(gone.kernel_name, gone.kernel_args, b"a program whose source left the search path")
        b.put("activ.c.o", f"-mcpu={target.arch} -DN=4", b"a row laid out as MIOpen's")
    report = export_cache(cached)
    assert report.counts == {"no-source": 1, "not-a-key": 1}
    assert {(s.kernel_name, s.reason) for s in report.skipped} == {("gone.c.o", "no-source"), ("activ.c.o", "not-a-key")}


@pytest.mark.parametrize("case", ["no cache", "unknown target", "malformed target", "unwritable -o", "files in -o"])
def test_bad_input_is_one_line_and_exit_1(kdb, cached, isolated, monkeypatch, case):
    args = ["-o", cached]
    if case == "no cache":
        monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(isolated / "nothing-here"))
    elif case == "unknown target":
        args += ["--target", "sm_88_1"]  # an arch no chain device is (the GPU machine's chain device is sm_90_132)
    elif case == "malformed target":
        args += ["--target", "not a target"]
    elif case == "unwritable -o":
        (isolated / "a-file").write_text("")
        args = ["-o", isolated / "a-file" / "exported"]
    else:
        cached.mkdir()
        (cached / "notes.txt").write_text("mine")
    code, out, err = kdb("cache", "export", *args)
    assert code == 1 and not out and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    expected = {"no cache": "no user cache in", "unknown target": "no user cache for target sm_88_1",
                "malformed target": "malformed target", "unwritable -o": "is a file",
                "files in -o": "already holds 1 file(s) (notes.txt)"}[case]
    assert expected in err
    if case == "files in -o":  # --force writes beside what is there, and leaves it
        code, out, err = kdb("cache", "export", *args, "--force")
        assert code == 0 and (cached / "notes.txt").read_text() == "mine" and list(cached.glob("*.kdb")), err


def test_a_cache_folder_others_may_write_is_refused(kdb, cached, isolated):
    os.chmod(isolated / "cache", 0o777)
    code, out, err = kdb("cache", "export", "-o", cached)
    assert code == 1 and "may be written by others" in err and not cached.exists()


def test_one_target_with_its_cu_count_and_the_cluster_note(kdb, warm, cached, monkeypatch):
    report = _export(kdb, cached, "--target", warm["target"])
    assert [Path(p).name for p in report["targets"][0]["find_dbs"]] == [f"{warm['target']}.fdb"]
    assert "exported only once a hit wrote them through to this user cache" in report["remote"]
    monkeypatch.setenv("KDB_REMOTE_CACHE", "redis://cache.invalid:6379/0")  # named, never connected to
    code, out, err = kdb("cache", "export", "-o", cached.with_name("again"))
    assert code == 0 and "note: the cluster cache (KDB_REMOTE_CACHE)" in err and "next: kdb package" in out
    code, out, _ = kdb("cache", "export", "--help")
    assert code == 0 and "KDB_REMOTE_CACHE" in out and "through to this user cache" in " ".join(out.split())


def _split_limit(bundle: Path, find_db: Path) -> int:
    """A --max-wheel-size that cuts ``bundle``'s wheel into at least two parts, each of which
    still holds its largest program and the find-db (with room to spare: the cut is planned on
    estimates, the wheels are measured)."""
    from kdbkit.kdb.split import FILE_OVERHEAD, entry_bytes
    from kdbkit.packager.distribute import PACKAGE_OVERHEAD

    with open_bundle(bundle) as b:
        sizes = [entry_bytes(e) for e in b.entries()]
    limit = max(sizes) + FILE_OVERHEAD + find_db.stat().st_size + PACKAGE_OVERHEAD + (32 << 10)
    part_budget = limit - find_db.stat().st_size - PACKAGE_OVERHEAD - FILE_OVERHEAD
    assert sum(sizes) > part_budget, f"too few programs to split ({sizes})"
    return limit


@pytest.mark.slow  # a fresh virtual environment, pip, and five processes
@pytest.mark.parametrize("split", [False, True], ids=["one-wheel", "split-by-size"])
def test_export_after_a_jit_run_package_install_into_a_fresh_venv_and_run_with_jit_off(tmp_path, split, chain_device):
    """The issue's CI line, literally: export after a JIT run, package, install into a fresh
    virtual environment, and run with JIT off: every program of the exported package, counted by
    the tier that served it, comes from "system". Split by size, the package's parts install
    together and serve every program between them."""
    from tests.packager.test_install_end_to_end import KDB, _env, _fresh_venv, _run

    job = [str(Path(export_job.__file__))]
    backend = {"KDB_BACKEND": chain_device.backend}  # the chain tests' device: PoCL in CI, CUDA on the GPU machine
    first = _env(tmp_path / "first", **backend)
    warm = json.loads(_run([sys.executable, *job, "warm"], first).stdout.splitlines()[-1])
    assert warm["ok"] and set(warm["resolved"]) == {"jit"}, warm

    report = json.loads(_run(KDB + ["cache", "export", "-o", str(tmp_path / "exported"), "--json"], first).stdout)
    (done,) = report["targets"]
    assert report["skipped"] == [] and done["programs"] > 0 and len(done["find_dbs"]) == 1
    limit = _split_limit(Path(done["bundle"]), Path(done["find_dbs"][0])) if split else 0
    packaged = json.loads(_run(KDB + ["package", done["bundle"], "--find-db", done["find_dbs"][0], "-o",
                                      str(tmp_path / "wheels"), "--max-wheel-size", str(limit), "--json"],
                               first).stdout)
    wheel, *others = packaged["wheels"]
    assert len(others) >= 1 if split else others == [], packaged
    assert all(p["bytes"] <= limit for p in packaged["packages"]) if split else True, packaged

    python = _fresh_venv(tmp_path / "venv")
    kdb = [str(python)] + KDB[1:]
    installed = json.loads(_run(kdb + ["install", "--from", str(tmp_path / "wheels"), "--target", warm["target"],
                                       "--json"], _env(tmp_path / "install", **backend)).stdout)
    (device,) = installed["devices"]
    assert Path(device["chosen"]) == Path(wheel) and device["installed"] == "pip", device
    assert device["parts"] == others, device

    # A fresh process in the fresh environment: JIT off, an empty cache and find-db.
    second = _env(tmp_path / "second", KDB_DISABLE_JIT="1", **backend)
    ran = json.loads(_run([str(python), *job, "check"], second).stdout.splitlines()[-1])
    assert len(ran["bundles"]) == 1 + len(others), ran  # one bundle a part
    assert all(str(tmp_path / "venv") in b for b in ran["bundles"]), ran  # served by the packages installed there
    assert ran["by_source"] == {"system": done["programs"]} == {"system": ran["entries"]}, ran
    assert ran["resolved"] == {"system": done["programs"]} and ran["ok"], ran
    assert ran["choice"] == "find-db" and ran["ranking"] == [str(Path(ran["bundle"]).with_name(
        Path(done["find_dbs"][0]).name))]
