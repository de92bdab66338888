"""Bit-identical rebuilds: the same catalogue built and packaged twice, in other folders, with
other temporary folders and clocks, gives the same SHA-256 for every bundle and wheel (NVRTC
and clang for amdgcn); SOURCE_DATE_EPOCH is the one time recorded; a reproducible build keeps
only entries built the same way; merged shards and wheels do not depend on order or clock."""

from __future__ import annotations

import glob
import hashlib
import os
import random
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from kdbkit.kdb import KdbError, Target, merge_bundles, open_bundle, write_bundle
from kdbkit.kdb.reproducible import created_stamp, zip_date_time
from kdbkit.packager import build_bundles
from kdbkit.packager.build import build, plan
from kdbkit.packager.wheel import write_package
from kdbkit.runtime.compilers import Compiler
from kdbkit.runtime.program_key import ProgramRequest
from tests.prerequisites import require_amdgcn_clang, require_nvrtc

# conv_igemm.c in FP16 is the program whose cubin NVRTC varies from process to process.
CATALOGUE = ("softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x4x9x9,xs=324x81x9x1,ys=324x81x9x1,"
             "a=1.0,b=0.0\n3-224-224-7x7-64-112-112-32-3x3-2x2-1x1-0-NCHW-FP16-F\n")
TARGETS = ("sm_80", "sm_90", "gfx90a", "gfx942")
KDB = "import sys; from kdbkit.runtime.cli.app import main; sys.exit(main())"


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _libfaketime() -> str | None:
    """libfaketime, to preload itself: the ``faketime`` wrapper opens a named semaphore after its
    own pid, and one left in /dev/shm by a killed run fails the next wrapper given that pid."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def _build_and_package(where: Path, later: bool) -> dict[str, str]:
    """``kdb build --reproducible`` and ``kdb package`` in a child process run from ``where``, with
    its own TMPDIR; ``later``: its clock 400 days ahead (faketime), or at least 2 s later."""
    (where / "tmp").mkdir(parents=True)
    (where / "catalogue.txt").write_text(CATALOGUE)
    env = {**os.environ, "TMPDIR": str(where / "tmp")}
    env.pop("SOURCE_DATE_EPOCH", None)
    if later:
        library = _libfaketime()
        if library:
            env.update(LD_PRELOAD=library, FAKETIME="+400d")
        else:
            time.sleep(2.1)  # past a zip timestamp's 2-second step
    build_args = ["build", *(a for t in TARGETS for a in ("--target", t)), "-c", "catalogue.txt", "-o", "bundles",
                  "-j", "2", "--reproducible"]
    for args in (build_args, ["package", "bundles", "-o", "wheels"]):
        run = subprocess.run([sys.executable, "-c", KDB, *args], cwd=where, env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "not reproducible" not in run.stderr, run.stderr
    return {**_digests(where / "bundles"), **_digests(where / "wheels")}


@pytest.mark.slow  # NVRTC and clang compile 28 programs twice, each NVRTC one in its own process
def test_two_builds_in_other_folders_at_other_times_give_identical_bundles_and_wheels(tmp_path):
    require_nvrtc()
    require_amdgcn_clang()
    first = _build_and_package(tmp_path / "a" / "one", later=False)
    second = _build_and_package(tmp_path / "b" / "another" / "folder", later=True)
    assert {name for name in first if name.endswith(".kdb")} == {f"{t}.kdb" for t in TARGETS}
    assert sum(name.endswith(".whl") for name in first) == len(TARGETS)
    assert first == second
    with open_bundle(tmp_path / "a" / "one" / "bundles" / "sm_80.kdb") as bundle:
        assert bundle.metadata.reproducible and bundle.metadata.created == ""  # no time without SOURCE_DATE_EPOCH


def test_the_shards_of_a_reproducible_build_merge_into_the_one_machine_bundle(tmp_path):
    require_amdgcn_clang()
    (tmp_path / "catalogue.txt").write_text(CATALOGUE)
    for part, out in (((0, 2), "s0"), ((1, 2), "s1"), (None, "whole")):
        report = build_bundles(["gfx942"], catalogues=[tmp_path / "catalogue.txt"], out=tmp_path / out, shard=part,
                               workers=2, reproducible=True)
        assert report.ok and not report.result.not_reproducible
    merge_bundles(tmp_path / "gfx942.kdb", [tmp_path / "s1" / "gfx942.kdb", tmp_path / "s0" / "gfx942.kdb"],
                  dictionary=False)
    assert (tmp_path / "gfx942.kdb").read_bytes() == (tmp_path / "whole" / "gfx942.kdb").read_bytes()


def test_source_date_epoch_is_the_time_recorded_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert created_stamp(reproducible=True) == "" and created_stamp() != ""
    assert zip_date_time() == (1980, 1, 1, 0, 0, 0)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000001")
    assert created_stamp() == created_stamp(reproducible=True) == "2023-11-14T22:13:21+00:00"
    assert zip_date_time() == (2023, 11, 14, 22, 13, 20)  # the zip format's 2-second steps
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert zip_date_time() == (1980, 1, 1, 0, 0, 0)  # a zip member cannot be older
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(KdbError, match="SOURCE_DATE_EPOCH='yesterday' is not a time in seconds"):
        created_stamp()


def _bundle(path: Path, entries) -> Path:
    path.parent.mkdir(parents=True)
    return write_bundle(path, Target.parse("sm_90"), entries, compiler="nvrtc 13.0", binary_format="cubin",
                        sources={"softmax.c": "ab" * 32})


def _entries(n: int):
    # Each a shared part and its own, both random: a dictionary pays, as it does on real cubins.
    shared = random.Random(0).randbytes(3000)
    return [("k.o", f"-DN={i}", shared + random.Random(i + 1).randbytes(1000)) for i in range(n)]


def test_a_bundle_merged_or_packaged_again_later_elsewhere_is_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a = _bundle(tmp_path / "a" / "sm_90.kdb", _entries(40))
    b = _bundle(tmp_path / "b" / "sm_90.kdb", _entries(60)[30:])
    one = merge_bundles(tmp_path / "ab.kdb", [a, b])
    time.sleep(1.1)
    other = merge_bundles(tmp_path / "ba.kdb", [b, a])  # the other order: the same rows, in key order
    assert (one.entries, one.duplicates, other.entries, other.duplicates) == (60, 10, 60, 10)
    assert (tmp_path / "ab.kdb").read_bytes() == (tmp_path / "ba.kdb").read_bytes()
    with open_bundle(tmp_path / "ab.kdb") as merged:
        assert merged.metadata.created == "2023-11-14T22:13:20+00:00" and merged.metadata.dictionary_size > 0
    first = write_package(tmp_path / "ab.kdb", tmp_path / "w1")
    time.sleep(2.1)
    second = write_package(tmp_path / "ba.kdb", tmp_path / "elsewhere" / "w2")
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        infos = wheel.infolist()
    assert infos[-1].filename.endswith(".dist-info/RECORD")
    assert {(i.date_time, i.create_system, i.external_attr >> 16 & 0o777) for i in infos} == {
        ((2023, 11, 14, 22, 13, 20), 3, 0o644)}
    from wheel.wheelfile import WheelFile

    with WheelFile(first) as wheel:  # RECORD as the installer checks it
        assert all(wheel.read(i.filename) is not None for i in infos)


class _FakeCompiler(Compiler):
    """A compiler of the given determinism that counts its compiles (in this process)."""

    name, backend, binary_format = "fake", "cuda", "cubin"

    def __init__(self, determinism: str):
        self.determinism = determinism
        self.compiles = 0

    def identity(self) -> str:
        return "fake 1.0"

    def compile(self, request, target, source) -> bytes:
        self.compiles += 1
        return hashlib.sha256(source.digest.encode() + " ".join(request.options).encode()).digest() * 64


def _fake_build(out: Path, compiler: _FakeCompiler, **kwargs):
    requests = [ProgramRequest("softmax.c", [f"-DKDB_N={n}"]) for n in range(3)]
    jobs, compilers = plan([Target.parse("sm_80")], requests=requests, compiler=compiler)
    before = compiler.compiles
    result = build(jobs, compilers, out, parallel=1, **kwargs)
    assert not result.failures
    return result, compiler.compiles - before


def test_a_reproducible_build_keeps_only_entries_built_the_same_way(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    varying, steady = _FakeCompiler("none"), _FakeCompiler("deterministic")
    bundle = tmp_path / "varying" / "sm_80.kdb"
    assert _fake_build(bundle.parent, varying)[1] == 3
    result, compiled = _fake_build(bundle.parent, varying, reproducible=True)
    assert compiled == 3  # an ordinary build's bytes from such a compiler are not this build's
    assert result.not_reproducible == {"sm_80": "fake gives other bytes on every build (docs/reliability.md)"}
    written = bundle.stat().st_mtime_ns
    result, compiled = _fake_build(bundle.parent, varying, reproducible=True)
    assert (compiled, result.reused, bundle.stat().st_mtime_ns) == (0, 3, written)  # unchanged: nothing rewritten
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # another time to record: rewritten, nothing compiled
    assert _fake_build(bundle.parent, varying)[1] == 0
    with open_bundle(bundle) as rewritten:
        assert rewritten.metadata.created == "2023-11-14T22:13:20+00:00" and rewritten.metadata.reproducible
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert _fake_build(tmp_path / "steady", steady)[1] == 3
    result, compiled = _fake_build(tmp_path / "steady", steady, reproducible=True)
    assert (compiled, result.reused, result.not_reproducible) == (0, 3, {})  # a deterministic compiler's are kept
    with open_bundle(tmp_path / "steady" / "sm_80.kdb") as kept:
        assert kept.metadata.reproducible and kept.metadata.created == ""
