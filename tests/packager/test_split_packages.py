"""Packages split by size (``kdb package --max-wheel-size``): a bundle whose wheel would pass the
limit becomes parts, each wheel under it, holding every entry exactly once; the first part names
the others' manifests, so only the parts of one packaging install together, all of them or none;
a part of another build, altered, unsigned or missing is refused before pip runs; the split is the
same bytes in another folder; the lock holds every part; installing removes parts an earlier
version left. The runtime serving every program from the installed parts with JIT off is
tests/runtime/test_cache_export.py's fresh-environment test, split-by-size."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdbkit.kdb import EntryInfo, Target, open_bundle, verify_bundle, write_bundle
from kdbkit.kdb.signing import load_public_keys, write_key_pair
from kdbkit.kdb.split import FILE_OVERHEAD, SplitError, entry_bytes, plan_parts
from kdbkit.kdb.version import __version__
from kdbkit.packager import install as installer
from kdbkit.packager import install_packages, package_bundles
from kdbkit.packager.errors import PackageError
from kdbkit.packager.select import scan
from kdbkit.packager.wheel import MANIFEST, SIGNATURE, module_name, package_name
from kdbkit.runtime.kernel_sources import source_digest
from tests.packager.test_packages import _find_db
from tests.runtime.chain_fixtures import isolated  # noqa: F401

SM90, SM90_132 = Target.parse("sm_90"), Target.parse("sm_90_132")
LIMIT = 300 << 10
SOURCES = {"softmax.c": source_digest("softmax.c")}


def _big_bundle(folder: Path, seed: int = 0, programs: int = 60, size: int = 20000) -> Path:
    """About 1.2 MB of incompressible programs of five kernels: at LIMIT, four or five parts."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    entries = [(f"k{i % 5}.c", f"-DN={i}", rng.randbytes(size)) for i in range(programs)]
    return write_bundle(folder / SM90.bundle_name(), SM90, entries, compiler="nvrtc 13.0", binary_format="cubin",
                        sources=SOURCES, dictionary=False, reproducible=True)


def _items(bundle: Path) -> dict[tuple[str, str], bytes]:
    with open_bundle(bundle) as b:
        return {(name, args): data for name, args, data in b.items()}


def _member(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name)


def _split(tmp_path: Path, folder: str = "w", seed: int = 0, **kw):
    bundle = _big_bundle(tmp_path / f"b{seed}", seed)
    packaged, _ = package_bundles([bundle], tmp_path / folder, find_dbs=[_find_db(tmp_path / "fdb")],
                                  max_wheel_bytes=LIMIT, **kw)
    return bundle, packaged


# --- where the cuts fall --------------------------------------------------------------------------

_entries = st.lists(st.tuples(st.sampled_from(["a.c", "b.c", "conv.c"]), st.integers(0, 99),
                              st.integers(1, 40_000)), max_size=60, unique_by=lambda t: (t[0], t[1]))


@settings(max_examples=200, deadline=None)
@given(_entries, st.integers(60_000, 400_000))
def test_parts_hold_each_key_once_in_key_order_each_under_the_size(rows, max_bytes):
    entries = [EntryInfo(name, f"-DN={n}", size, size, "0" * 32, True) for name, n, size in rows]
    parts = plan_parts(entries, max_bytes)
    flat = [key for part in parts for key in part]
    assert flat == sorted((e.kernel_name, e.kernel_args) for e in entries)  # each once, in key order
    sizes = {(e.kernel_name, e.kernel_args): entry_bytes(e) for e in entries}
    assert all(sum(sizes[k] for k in part) + FILE_OVERHEAD <= max_bytes for part in parts)
    assert all(parts) or parts == [[]]
    total = sum(sizes.values())
    if total + FILE_OVERHEAD <= max_bytes:
        assert len(parts) == 1  # what fits whole is not cut


def test_a_program_larger_than_a_part_is_refused_naming_it_and_the_size_that_would_do():
    entries = [EntryInfo("conv.c", "-DBIG", 500_000, 500_000, "0" * 32, True)]
    with pytest.raises(SplitError, match=r"conv.c \[-DBIG\], takes 500075 bytes") as err:
        plan_parts(entries, 400_000)
    assert err.value.needed == 500_075 + FILE_OVERHEAD


# --- packaging ------------------------------------------------------------------------------------

def test_a_bundle_over_the_limit_becomes_parts_under_it_holding_every_entry_once(tmp_path):
    bundle, packaged = _split(tmp_path)
    assert len(packaged) >= 3 and [p.part for p in packaged] == list(range(1, len(packaged) + 1))
    assert all(p.parts == len(packaged) and p.size == p.wheel.stat().st_size <= LIMIT for p in packaged)
    assert [p.wheel.name for p in packaged] == [
        f"{module_name(SM90_132, k)}-{__version__}-py3-none-any.whl" for k in range(1, len(packaged) + 1)]

    whole, seen = _items(bundle), {}
    with open_bundle(bundle) as b:
        md = b.metadata
    for p in packaged:
        module = module_name(SM90_132, p.part)
        folder = tmp_path / "x" / module
        folder.mkdir(parents=True)
        part = folder / "sm_90.kdb"
        part.write_bytes(_member(p.wheel, f"{module}/sm_90.kdb"))
        assert verify_bundle(part).ok
        with open_bundle(part) as b:  # an ordinary bundle of the whole's target, compiler and sources
            assert (b.metadata.target, b.metadata.compiler, b.metadata.source_digests) == (
                md.target, md.compiler, md.source_digests)
        items = _items(part)
        assert not set(items) & set(seen)
        seen.update(items)
        names = set(zipfile.ZipFile(p.wheel).namelist())
        assert (f"{module}/sm_90_132.fdb" in names) == (p.part == 1)  # the find-db goes with the first
    assert seen == whole

    first = json.loads(_member(packaged[0].wheel, f"{module_name(SM90_132)}/{MANIFEST}"))
    assert first["part"] == 1 and first["parts"] == len(packaged)
    assert first["others"] == {package_name(SM90_132, p.part): hashlib.sha256(_member(
        p.wheel, f"{module_name(SM90_132, p.part)}/{MANIFEST}")).hexdigest() for p in packaged[1:]}
    metadata = _member(packaged[0].wheel, f"{module_name(SM90_132)}-{__version__}.dist-info/METADATA").decode()
    assert [line for line in metadata.splitlines() if "part" in line.lower() and "Requires" in line] == [
        f"Requires-Dist: {package_name(SM90_132, p.part)}=={__version__}" for p in packaged[1:]]  # pip takes all
    provenance = json.loads(_member(packaged[1].wheel, f"{module_name(SM90_132, 2)}/provenance.intoto.json"))
    assert provenance["predicate"]["buildDefinition"]["externalParameters"]["splitFrom"] == {
        "part": 2, "parts": len(packaged), "bundleSha256": hashlib.sha256(bundle.read_bytes()).hexdigest()}


def test_a_bundle_under_the_limit_is_one_wheel_byte_for_byte_as_without_a_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    bundle = _big_bundle(tmp_path / "b")
    (one,), _ = package_bundles([bundle], tmp_path / "limited")
    (unlimited,), _ = package_bundles([bundle], tmp_path / "unlimited", max_wheel_bytes=None)
    assert one.parts == 1 and one.wheel.read_bytes() == unlimited.wheel.read_bytes()
    assert b'"part"' not in _member(one.wheel, f"{module_name(SM90)}/{MANIFEST}")


def test_the_same_bundle_splits_into_the_same_bytes_in_another_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    bundle = _big_bundle(tmp_path / "b")
    fdb = _find_db(tmp_path / "fdb")
    first, _ = package_bundles([bundle], tmp_path / "one", find_dbs=[fdb], max_wheel_bytes=LIMIT)
    moved = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(bundle.parent, moved)
    again, _ = package_bundles([moved / bundle.name], tmp_path / "two", find_dbs=[fdb], max_wheel_bytes=LIMIT)
    assert [(p.wheel.name, p.wheel.read_bytes()) for p in first] == [(p.wheel.name, p.wheel.read_bytes())
                                                                     for p in again]


def test_the_command_line_reports_each_wheel_and_its_size_and_refuses_bad_limits(kdb, tmp_path):
    bundle = _big_bundle(tmp_path / "b")
    code, out, err = kdb("package", bundle, "-o", tmp_path / "w", "--max-wheel-size", "300K", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["max_wheel_bytes"] == LIMIT and len(report["packages"]) >= 3
    assert all(p["bytes"] == Path(p["wheel"]).stat().st_size <= LIMIT for p in report["packages"])
    code, out, _ = kdb("package", bundle, "-o", tmp_path / "w2", "--max-wheel-size", "300K")
    assert code == 0 and f"(sm_90.kdb, part 1 of {len(report['packages'])})" in out and "KiB" in out

    code, _, err = kdb("package", bundle, "-o", tmp_path / "w3", "--max-wheel-size", "3 parsecs")
    assert code == 2 and err.count("\n") == 1 and "--max-wheel-size: '3 parsecs' is not a size" in err
    code, _, err = kdb("package", bundle, "-o", tmp_path / "w4", "--max-wheel-size", "10K")
    assert code == 1 and err.count("\n") == 1 and "alone needs a wheel of about" in err
    assert "raise --max-wheel-size to at least" in err and "Traceback" not in err
    assert not list((tmp_path / "w4").glob("*.whl"))


# --- installing -----------------------------------------------------------------------------------

@pytest.fixture
def pip_calls(monkeypatch) -> list:
    """pip replaced by a recorder: each call's wheels."""
    calls = []
    monkeypatch.setattr(installer, "pip_install_wheels", lambda wheels, digests=None: calls.append(list(wheels)))
    return calls


def test_the_parts_are_one_candidate_and_install_in_one_pip_run(tmp_path, pip_calls):
    _, packaged = _split(tmp_path)
    (candidate,) = scan(tmp_path / "w")
    assert candidate.path == packaged[0].wheel and list(candidate.others) == [p.wheel for p in packaged[1:]]
    report = install_packages(tmp_path / "w", targets=[SM90_132])
    assert report.ok and pip_calls == [[p.wheel for p in packaged]]


def test_a_missing_part_leaves_nothing_to_install_and_says_which(tmp_path, pip_calls):
    _, packaged = _split(tmp_path)
    packaged[2].wheel.unlink()
    report = install_packages(tmp_path / "w", targets=[SM90_132], dry_run=True)
    (choice,) = report.choices
    assert choice.chosen is None and not report.ok and pip_calls == []
    (reason,) = [why for c, why in choice.rejected if c.path == packaged[0].wheel]
    assert f"part 3 of its {len(packaged)} ({package_name(SM90_132, 3)} {__version__}) is not here" in reason


def test_a_part_without_its_first_is_rejected_as_such(tmp_path):
    _, packaged = _split(tmp_path)
    packaged[0].wheel.unlink()
    rejected = {c.path: c.damaged for c in scan(tmp_path / "w")}
    assert set(rejected) == {p.wheel for p in packaged[1:]}
    assert all("whose first part is not here" in why for why in rejected.values())


def test_a_part_of_another_build_is_not_taken_for_one_of_these(tmp_path, pip_calls):
    _, ours = _split(tmp_path)
    _, theirs = _split(tmp_path, "v", seed=1)  # the same names and sources, other binaries
    (first,) = scan(tmp_path / "v")  # a first part given another build's part by hand
    with pytest.raises(PackageError, match="not the part 2 of .* names"):
        installer.verify(replace(first, others=(ours[1].wheel, *first.others[1:])))

    shutil.copyfile(theirs[1].wheel, ours[1].wheel)
    (tmp_path / "w" / installer.SUMS_FILE).unlink()  # no SHA256SUMS to catch it: the first part's manifest does
    report = install_packages(tmp_path / "w", targets=[SM90_132], dry_run=True)
    assert not report.ok and pip_calls == []
    reasons = {c.path: why for c, why in report.choices[0].rejected}
    assert "part 2 of its" in reasons[ours[0].wheel] and "whose first part is not here" in reasons[ours[1].wheel]


def test_an_altered_part_is_refused_before_pip_runs(tmp_path, pip_calls):
    _, packaged = _split(tmp_path)
    wheel = packaged[-1].wheel
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    with pytest.raises(PackageError, match=wheel.name):
        install_packages(tmp_path / "w", targets=[SM90_132])
    assert pip_calls == []


def test_signed_parts_install_under_the_key_and_one_unsigned_part_is_refused(tmp_path, pip_calls):
    _, pub, signer = write_key_pair(tmp_path / "keys")
    key = load_public_keys([pub])
    _, packaged = _split(tmp_path, signer=signer)
    assert install_packages(tmp_path / "w", targets=[SM90_132], trusted_keys=key).ok
    assert pip_calls == [[p.wheel for p in packaged]]

    unsigned, _ = _split(tmp_path, "u")  # the same bytes but for the signatures
    part = packaged[2].wheel
    shutil.copyfile(tmp_path / "u" / part.name, part)
    assert f"{module_name(SM90_132, 3)}/{SIGNATURE}" not in zipfile.ZipFile(part).namelist()
    installer.write_sums(tmp_path / "w", [p.wheel for p in packaged])
    with pytest.raises(PackageError, match=f"{part.name}: {package_name(SM90_132, 3)} is not signed"):
        install_packages(tmp_path / "w", targets=[SM90_132], trusted_keys=key)
    assert len(pip_calls) == 1


def test_the_lock_holds_every_part_and_a_locked_install_takes_them_all(kdb, isolated, tmp_path, monkeypatch):
    from kdbkit.runtime import paths
    from tests.packager.test_lock import _pip_into

    _, packaged = _split(tmp_path)
    site = isolated / "site"
    _pip_into(site, [p.wheel for p in packaged])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    code, out, err = kdb("lock", "-o", tmp_path / "kdbkit.lock")
    assert code == 0 and f"{len(packaged)} kernel package(s) locked" in out, err
    code, out, err = kdb("install", "--locked", tmp_path / "kdbkit.lock", "--from", tmp_path / "w", "--dry-run")
    assert code == 0, err
    assert sorted(line.split(" from ")[0] for line in out.splitlines()) == sorted(
        f"would install {package_name(SM90_132, p.part)} {__version__}" for p in packaged)
    assert kdb("doctor", "--locked", tmp_path / "kdbkit.lock", "--target", "sm_90_132")[0] == 0


@pytest.mark.slow  # a fresh virtual environment and pip, twice
def test_installing_fewer_parts_removes_the_parts_an_earlier_package_left(tmp_path):
    from tests.packager.test_install_end_to_end import KDB, _env, _fresh_venv, _run

    bundle, packaged = _split(tmp_path)
    package_bundles([bundle], tmp_path / "whole", find_dbs=[_find_db(tmp_path / "fdb")])
    python = _fresh_venv(tmp_path / "venv")
    kdb, env = [str(python)] + KDB[1:], _env(tmp_path / "env")

    def installed() -> list[str]:
        listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json", "--path",
                                 subprocess.check_output([str(python), "-c", "import sysconfig; print("
                                                          "sysconfig.get_path('purelib'))"], text=True).strip()],
                                capture_output=True, text=True, check=True).stdout
        return sorted(p["name"] for p in json.loads(listed) if p["name"].startswith("kdbkit-kernels"))

    _run(kdb + ["install", "--from", str(tmp_path / "w"), "--target", "sm_90_132"], env)
    assert installed() == sorted(package_name(SM90_132, p.part) for p in packaged)
    _run(kdb + ["install", "--from", str(tmp_path / "whole"), "--target", "sm_90_132"], env)
    assert installed() == [package_name(SM90_132)]
