"""kdbkit.lock: `kdb lock` records the installed kernel packages byte-identically; `kdb install
--locked` installs exactly them or nothing, naming the first difference; `kdb doctor --locked`
names every difference; a bad lock file is one line.

Packages are real `kdb package` wheels (of small bundles with fake binaries), installed with the
real pip, as `kdb install` names them (with their SHA-256), into a folder put on sys.path: the
runtime finds them there as it finds a virtual environment's. The slow test at the end does the
whole round in fresh virtual environments through `kdb install` itself.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kdbkit.kdb import Target, write_bundle
from kdbkit.kdb.version import __version__
from kdbkit.packager import install as installer
from kdbkit.packager.lock_file import LOCK_FORMAT
from kdbkit.packager.wheel import compatible_versions, write_package
from kdbkit.runtime import paths
from kdbkit.runtime.kernel_sources import source_digest
from tests.packager.test_packages import _bundle
from tests.runtime.chain_fixtures import chain_device, isolated  # noqa: F401

SM90, GFX942 = Target.parse("sm_90"), Target("hip", "gfx942")
SM90_WHEEL = f"kdbkit_kernels_sm_90-{__version__}-py3-none-any.whl"
_MAJOR, _MINOR, _PATCH = __version__.split(".")
NEWER = f"{_MAJOR}.{_MINOR}.{int(_PATCH) + 1}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _package(folder: Path, wheels: Path, target: Target, **kw) -> Path:
    wheel = write_package(_bundle(folder / str(target), target), wheels, **kw)
    installer.write_sums(wheels, [wheel])
    return wheel


def _pip_into(site: Path, wheels: list[Path]) -> None:
    """Install ``wheels`` into folder ``site`` as `kdb install` does (file URLs with their SHA-256)."""
    urls = [f"{w.resolve().as_uri()}#sha256={_sha256(w)}" for w in wheels]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                           "--disable-pip-version-check", "--target", str(site), *urls],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def wheels(tmp_path) -> Path:
    """A folder with the wheels of an arch-wide sm_90 and gfx942 package, and their SHA256SUMS."""
    for target in (SM90, GFX942):
        _package(tmp_path / "bundles", tmp_path / "wheels", target)
    return tmp_path / "wheels"


@pytest.fixture
def site(isolated, wheels, monkeypatch) -> Path:
    """Both packages installed into a folder on sys.path; no other system bundle anywhere."""
    folder = isolated / "site"
    _pip_into(folder, sorted(wheels.glob("*.whl")))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(paths, "_entry_points_seen", None)
    return folder


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_the_lock_records_each_package_and_is_byte_identical_when_written_twice(kdb, site, wheels, tmp_path):
    code, out, err = kdb("lock", "-o", tmp_path / "a.lock")
    assert code == 0, err
    assert "2 kernel package(s) locked" in out
    assert kdb("lock", "-o", tmp_path / "b.lock")[0] == 0
    text = (tmp_path / "a.lock").read_bytes()
    assert text == (tmp_path / "b.lock").read_bytes()
    lock = tomllib.loads(text.decode())
    assert lock["format"] == LOCK_FORMAT
    assert [p["name"] for p in lock["package"]] == ["kdbkit-kernels-gfx942", "kdbkit-kernels-sm_90"]
    sm90 = lock["package"][1]
    assert sm90 == {
        "name": "kdbkit-kernels-sm_90", "version": __version__, "target": "sm_90",
        "kdbkit": compatible_versions(__version__), "compiler": "nvrtc 13.0",
        "wheel-sha256": _sha256(wheels / SM90_WHEEL),
        "files": {"sm_90.kdb": _sha256(site / "kdbkit_kernels_sm_90" / "sm_90.kdb")},
        "sources": {"softmax.c": source_digest("softmax.c")},
    }
    assert str(tmp_path) not in text.decode()  # no path, so another folder locks to the same bytes


def test_the_same_packages_installed_elsewhere_lock_to_the_same_bytes(kdb, site, wheels, tmp_path, monkeypatch):
    assert kdb("lock", "-o", tmp_path / "here.lock")[0] == 0
    elsewhere = tmp_path / "other" / "site"
    _pip_into(elsewhere, sorted(wheels.glob("*.whl"), reverse=True))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    monkeypatch.syspath_prepend(str(elsewhere))
    assert kdb("lock", "-o", tmp_path / "there.lock")[0] == 0
    assert (tmp_path / "there.lock").read_bytes() == (tmp_path / "here.lock").read_bytes()


def test_without_a_recorded_wheel_hash_the_wheels_of_from_are_hashed(kdb, site, wheels, tmp_path):
    assert kdb("lock", "-o", tmp_path / "recorded.lock")[0] == 0
    for record in site.glob("*.dist-info/direct_url.json"):  # as an older pip, or a copied site-packages
        record.unlink()
    code, _, err = kdb("lock", "-o", tmp_path / "x.lock")
    line = _one_line(err)
    assert code == 1 and "kdbkit-kernels-gfx942" in line and "records no wheel SHA-256" in line
    assert "`kdb lock --from DIR`" in line and not (tmp_path / "x.lock").exists()

    assert kdb("lock", "-o", tmp_path / "from.lock", "--from", wheels)[0] == 0
    assert (tmp_path / "from.lock").read_bytes() == (tmp_path / "recorded.lock").read_bytes()

    other = tmp_path / "rebuilt"  # the same name and version, another build: not the wheel installed
    write_package(_bundle(tmp_path / "b2", SM90, sources={"softmax.c": "1" * 64}), other)
    shutil.copy(wheels / f"kdbkit_kernels_gfx942-{__version__}-py3-none-any.whl", other)
    code, _, err = kdb("lock", "-o", tmp_path / "y.lock", "--from", other)
    line = _one_line(err)
    assert code == 1 and f"kdbkit-kernels-sm_90 {__version__}: " in line and "another build" in line


def test_an_altered_installation_is_refused_not_locked(kdb, site, tmp_path):
    _flip_byte(site / "kdbkit_kernels_sm_90" / "sm_90.kdb")
    code, _, err = kdb("lock", "-o", tmp_path / "a.lock")
    line = _one_line(err)
    assert code == 1 and "sm_90.kdb does not match the SHA-256 in its manifest.json" in line
    assert "reinstall it with `kdb install`" in line


def test_doctor_locked_passes_then_names_each_difference_on_its_own_line(kdb, site, tmp_path):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    code, out, err = kdb("doctor", "--locked", lock, "--target", "sm_90_132", "--target", "gfx942_304")
    assert code == 0 and "the environment matches" in out, out + err

    bundle = site / "kdbkit_kernels_sm_90" / "sm_90.kdb"
    locked_digest = _sha256(bundle)
    _flip_byte(bundle)
    code, out, err = kdb("doctor", "--locked", lock, "--target", "sm_90_132")
    assert code == 1 and not err
    assert out.splitlines() == [f"kdbkit-kernels-sm_90 {__version__}: {bundle} sha256 {_sha256(bundle)} "
                                f"!= locked {locked_digest}"]

    extra = write_bundle(tmp_path / "system" / "sm_90_132.kdb", Target.parse("sm_90_132"),
                         [("k.c.o", "-mcpu=sm_90", b"x" * 64)], compiler="nvrtc 13.0", binary_format="cubin")
    shutil.rmtree(next(site.glob("kdbkit_kernels_gfx942-*.dist-info")))
    code, out, _ = kdb("doctor", "--locked", lock, "--target", "sm_90_132", "--json")
    differences = json.loads(out)["differences"]
    assert code == 1 and len(differences) == 3, differences
    assert differences[0] == f"kdbkit-kernels-gfx942 {__version__}: not installed"
    assert differences[1].startswith(f"kdbkit-kernels-sm_90 {__version__}: {bundle} sha256 ")
    assert differences[2] == f"{extra} (KDB_SYSTEM_DB_PATH): would serve sm_90_132 and is not in the lock"


def test_doctor_locked_names_an_extra_bundle_that_would_serve_a_local_device(kdb, site, tmp_path, chain_device):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    code, out, err = kdb("doctor", "--locked", lock)  # the local PoCL device: neither package serves it
    assert code == 0 and "the environment matches" in out, out + err
    from kdbkit.runtime.backends.registry import binary_format_of

    local = chain_device.target
    extra = write_bundle(tmp_path / "system" / local.bundle_name(), local, [("k.c", "-DX", b"x" * 64)],
                         compiler="pocl", binary_format=binary_format_of(chain_device.backend))
    code, out, _ = kdb("doctor", "--locked", lock)
    assert code == 1 and out.splitlines() == [f"{extra} (KDB_SYSTEM_DB_PATH): would serve {local} and is not in "
                                              "the lock"]


def test_doctor_locked_names_a_kdbkit_outside_the_range_and_other_kernel_sources(kdb, site, tmp_path):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    text = lock.read_text()
    edited = text.replace(compatible_versions(__version__), ">=99.0", 1).replace(source_digest("softmax.c"), "0" * 64, 1)
    lock.write_text(edited)
    code, out, _ = kdb("doctor", "--locked", lock, "--target", "sm_90_132")
    assert code == 1 and out.splitlines() == [
        f"kdbkit-kernels-gfx942 {__version__}: made for kdbkit >=99.0; this is kdbkit {__version__}",
        f"kdbkit-kernels-gfx942 {__version__}: built from other kernel sources than this kdbkit's (1 of 1 differ: "
        "softmax.c), so its programs would compile"]


@pytest.fixture
def no_pip(site, monkeypatch):
    """Fail the test if the installer runs pip (or anything else) after the packages are in place."""
    ran = []

    def refuse(command, *args, **kwargs):
        ran.append(command)
        raise AssertionError(f"ran {command}")
    monkeypatch.setattr(installer.subprocess, "run", refuse)
    return ran


def test_a_locked_install_checks_every_wheel_before_pip_runs_once(kdb, site, wheels, tmp_path, monkeypatch):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    code, out, err = kdb("install", "--locked", lock, "--from", wheels, "--dry-run")
    assert code == 0, err
    assert [line.split(" from ")[0] for line in out.splitlines()] == [
        f"would install kdbkit-kernels-gfx942 {__version__}", f"would install kdbkit-kernels-sm_90 {__version__}"]

    commands = []
    monkeypatch.setattr(installer.subprocess, "run", lambda command, **kw: commands.append(command)
                        or subprocess.CompletedProcess(command, 0, "", ""))
    code, out, err = kdb("install", "--locked", lock, "--from", wheels)
    assert code == 0, err
    (command,) = commands  # one pip run, each wheel named with its locked SHA-256
    assert sorted(command[-2:]) == sorted(f"{w.resolve().as_uri()}#sha256={_sha256(w)}" for w in wheels.glob("*.whl"))


def test_a_locked_install_refuses_a_wheel_with_one_byte_changed_and_installs_nothing(kdb, site, wheels, tmp_path,
                                                                                     no_pip):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    locked = _sha256(wheels / SM90_WHEEL)
    _flip_byte(wheels / SM90_WHEEL)
    code, out, err = kdb("install", "--locked", lock, "--from", wheels)
    line = _one_line(err)
    assert code == 1 and not out and no_pip == []
    assert line.startswith(f"error: kdbkit-kernels-sm_90 {__version__}: wheel sha256 {_sha256(wheels / SM90_WHEEL)} "
                           f"!= locked {locked}")


def test_a_locked_install_names_a_missing_package_or_another_version(kdb, site, wheels, tmp_path, no_pip):
    lock = tmp_path / "kdbkit.lock"
    assert kdb("lock", "-o", lock)[0] == 0
    (wheels / SM90_WHEEL).unlink()
    code, _, err = kdb("install", "--locked", lock, "--from", wheels)
    assert code == 1 and f"kdbkit-kernels-sm_90 {__version__}: not in {wheels} (no {SM90_WHEEL})" in _one_line(err)

    _package(tmp_path / "newer", wheels, SM90, version=NEWER)
    code, _, err = kdb("install", "--locked", lock, "--from", wheels)
    assert code == 1 and no_pip == []
    assert f"kdbkit-kernels-sm_90 {__version__}: {wheels} has version {NEWER}, not the locked {__version__}" in \
        _one_line(err)


def test_locked_goes_with_from_alone(kdb, tmp_path):
    lock = tmp_path / "kdbkit.lock"
    lock.write_text(f"format = {LOCK_FORMAT}\n")
    code, _, err = kdb("install", "--locked", lock, "--from", tmp_path, "--target", "sm_90_132")
    assert code == 2 and "leave out --target" in _one_line(err)


_GOOD = f"""format = {LOCK_FORMAT}

[[package]]
name = "kdbkit-kernels-sm_90"
version = "{__version__}"
target = "sm_90"
kdbkit = "{compatible_versions(__version__)}"
compiler = "nvrtc 13.0"
wheel-sha256 = "{"a" * 64}"

[package.files]
"sm_90.kdb" = "{"b" * 64}"

[package.sources]
"""


@pytest.mark.parametrize("content, problem", [
    (None, "no lock file"),
    ("folder", "is a folder, not a lock file"),
    (b"\xff\xfe format", "not UTF-8 text"),
    ("format = 1\n[[package]\n", "not TOML"),
    ("[[package]]\nname = 'x'\n", "is not a kdbkit lock (no `format = 1` line)"),
    (f"format = {LOCK_FORMAT + 1}\n", f"is lock format {LOCK_FORMAT + 1}, newer than this kdbkit reads"),
    ("format = 0\n", "this kdbkit reads format 1"),
    (_GOOD.replace('version = ', 'versions = '), "package 1 (kdbkit-kernels-sm_90) has no 'version'"),
    (_GOOD.replace("a" * 64, "abc"), "wheel-sha256 is not 64 lower-case hex digits"),
    (_GOOD.replace('target = "sm_90"', 'target = "sm_9x"'), "target 'sm_9x'"),
    (_GOOD.replace('"sm_90.kdb"', '"../sm_90.kdb"'), "'../sm_90.kdb' in files is not a bundle or find-db name"),
    (_GOOD + _GOOD.split("\n", 1)[1], "package kdbkit-kernels-sm_90 is locked twice"),
    ("format = 1\npackage = 3\n", "`package` is not a list"),
])
@pytest.mark.parametrize("command", [("doctor", "--locked"), ("install", "--from", ".", "--locked")])
def test_a_bad_lock_file_is_one_line_naming_it_and_the_fix(kdb, tmp_path, monkeypatch, content, problem, command):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "kdbkit.lock"
    if content == "folder":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, out, err = kdb(*command, path)
    line = _one_line(err)
    assert code == 1 and not out
    assert str(path) in line and problem in line, line
    assert "`kdb lock`" in line or "upgrade kdbkit" in line or "give the path" in line


def test_the_good_lock_of_the_bad_lock_cases_reads(tmp_path):
    """The cases above each break one thing of a lock that reads."""
    from kdbkit.packager.lock_file import lock_text, read_lock

    path = tmp_path / "kdbkit.lock"
    path.write_text(_GOOD)
    lock = read_lock(path)
    assert [p.label for p in lock.packages] == [f"kdbkit-kernels-sm_90 {__version__}"]
    path.write_text(lock_text(lock))
    assert read_lock(path) == lock


@pytest.mark.slow
def test_lock_then_locked_install_in_fresh_environments(tmp_path, wheels):
    """`kdb install` into one fresh environment, `kdb lock` there, `kdb install --locked` into
    another: the same lock again, and `kdb doctor --locked` passes; a wheel with one byte changed
    is refused with the environment left as it was."""
    from tests.packager.test_install_end_to_end import KDB, _fresh_venv
    from tests.packager.test_malicious_wheels import _env, _state

    def kdb_in(python, *args, ok=True):
        done = subprocess.run([str(python)] + KDB[1:] + [str(a) for a in args], env=_env(tmp_path),
                              capture_output=True, text=True, timeout=300)
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done

    first = _fresh_venv(tmp_path / "first")
    kdb_in(first, "install", "--from", wheels, "--target", "sm_90_132", "--target", "gfx942_304")
    kdb_in(first, "lock", "-o", tmp_path / "kdbkit.lock")  # the wheels' SHA-256 recorded by the install

    second = _fresh_venv(tmp_path / "second")
    kdb_in(second, "install", "--locked", tmp_path / "kdbkit.lock", "--from", wheels)
    kdb_in(second, "lock", "-o", tmp_path / "again.lock")
    assert (tmp_path / "again.lock").read_bytes() == (tmp_path / "kdbkit.lock").read_bytes()
    kdb_in(second, "doctor", "--locked", tmp_path / "kdbkit.lock", "--target", "sm_90_132")

    third = _fresh_venv(tmp_path / "third")
    _flip_byte(wheels / SM90_WHEEL)
    before = _state(third)
    done = kdb_in(third, "install", "--locked", tmp_path / "kdbkit.lock", "--from", wheels, ok=False)
    assert done.returncode == 1 and f"kdbkit-kernels-sm_90 {__version__}: wheel sha256 " in done.stderr
    assert _state(third) == before, "something was installed"


def test_the_writer_escapes_what_toml_must_and_reads_back_the_same():
    from kdbkit.packager.lock_file import Lock, LockedPackage, lock_text

    odd = 'nvrtc "13.0" \\ C:\\tmp\n\ttab \x7f é'
    package = LockedPackage("kdbkit-kernels-sm_90", __version__, "sm_90", ">=0.2", odd, "a" * 64,
                            {"sm_90.kdb": "b" * 64}, {"sub/dir x.c": "c" * 64, 'q"uote.h': "d" * 64, "plain_h": "e"})
    parsed = tomllib.loads(lock_text(Lock((package,))))["package"][0]
    assert parsed["compiler"] == odd and parsed["sources"] == package.sources
