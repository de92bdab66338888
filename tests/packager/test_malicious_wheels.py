"""Kernel wheels altered to run code or exhaust memory, each refused by `kdb install` with nothing
installed: made from a real `kdb package` output, rewritten with zipfile (RECORD and SHA256SUMS
made to agree, as whoever altered them would), installed with the real pip into a fresh virtual
environment whose site-packages, db folder and `bin/kdb` are compared before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kdbkit.kdb import Target
from kdbkit.kdb.version import __version__
from kdbkit.packager import install as installer
from kdbkit.packager.errors import PackageError
from kdbkit.packager.select import scan
from tests.packager.test_install_end_to_end import KDB, _fresh_venv
from tests.packager.test_packages import _bundle, _rewrite, _with_member

pytestmark = pytest.mark.slow  # a fresh virtual environment and pip for each wheel

MODULE = "kdbkit_kernels_sm_90"
DIST_INFO = f"{MODULE}-{__version__}.dist-info"
_MAJOR, _MINOR, _PATCH = __version__.split(".")
NEWER = f"{_MAJOR}.{_MINOR}.{int(_PATCH) + 1}"  # a higher version for the same kdbkit versions: preferred


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh environment with a `bin/kdb` of its own, shared by the tests (none installs)."""
    root = tmp_path_factory.mktemp("venv")
    python = _fresh_venv(root / "env")
    kdb = root / "env" / "bin" / "kdb"
    kdb.write_text("#!/bin/sh\necho the environment's own kdb\n")
    return python


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"), KDB_USER_DB_PATH=str(tmp_path / "userdb"))
    return env


def _packaged(tmp_path) -> Path:
    """The wheel `kdb package` writes for an arch-wide sm_90 bundle, in a folder with its SHA256SUMS."""
    bundle = _bundle(tmp_path / "bundles")
    done = subprocess.run(KDB + ["package", str(bundle), "-o", str(tmp_path / "wheels"), "--json"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = json.loads(done.stdout)["wheels"]
    return Path(wheel)


def _state(python: Path) -> dict[str, tuple]:
    """Every file of the environment (site-packages, share/kdbkit/db, bin) with its size and mtime."""
    root = python.parent.parent
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _install(python: Path, folder: Path, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python)] + KDB[1:] + ["install", "--from", str(folder), "--target", "sm_90_132"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)


def _refused(python: Path, folder: Path, tmp_path, why: str) -> None:
    before = _state(python)
    done = _install(python, folder, tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(errors) == 1 and why in errors[0], done.stderr
    assert _state(python) == before, "something was installed"
    assert (python.parent / "kdb").read_text().endswith("the environment's own kdb\n")


def _replace(name, change):
    def rewrite(infos):
        info, data = infos[name]
        return {**infos, name: (info, change(data))}
    return rewrite


def test_a_wheel_sha256sums_does_not_list_is_refused_though_newer(venv, tmp_path):
    wheel = _packaged(tmp_path)  # listed in SHA256SUMS
    newer = wheel.with_name(wheel.name.replace(__version__, NEWER))
    newer.write_bytes(wheel.read_bytes())

    def bump(infos):  # a consistent newer version, for the same kdbkit versions
        renamed = {n.replace(DIST_INFO, f"{MODULE}-{NEWER}.dist-info"): v for n, v in infos.items()}
        for name, (info, data) in list(renamed.items()):
            info.filename = name
            text = (data.replace(f"Version: {__version__}".encode(), f"Version: {NEWER}".encode())
                    if name.endswith("METADATA") else data)
            if name.endswith("manifest.json"):
                manifest = json.loads(data)
                manifest["version"] = NEWER
                text = json.dumps(manifest).encode()
            renamed[name] = (info, text)
        return renamed

    _rewrite(newer, bump)
    _refused(venv, tmp_path / "wheels", tmp_path, f"{newer}: not listed in {tmp_path / 'wheels' / 'SHA256SUMS'}")
    # with it gone, the listed wheel installs: the refusal was the unlisted file's
    newer.unlink()
    done = _install(venv, tmp_path / "wheels", tmp_path)
    assert done.returncode == 0, done.stderr
    subprocess.run([str(venv), "-m", "pip", "uninstall", "-y", "-q", "kdbkit-kernels-sm-90"], check=True,
                   capture_output=True)


def test_require_hashes_refuses_a_folder_without_sha256sums(venv, tmp_path):
    wheel = _packaged(tmp_path)
    (wheel.parent / "SHA256SUMS").unlink()
    before = _state(venv)
    done = subprocess.run([str(venv)] + KDB[1:] + ["install", "--from", str(wheel.parent), "--target", "sm_90_132",
                                                   "--require-hashes"], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "no SHA256SUMS lists it (--require-hashes)" in done.stderr, done.stderr
    assert _state(venv) == before


@pytest.mark.parametrize("alter, why", [
    (_replace(f"{DIST_INFO}/entry_points.txt",
              lambda data: data + b"\n[console_scripts]\nkdb = kdbkit_kernels_sm_90:bundle_dir\n"),
     f"member '{DIST_INFO}/entry_points.txt' is not the one `kdb package` writes"),
    (_with_member(f"{MODULE}/evil.pth", b"import os; os.system('touch /tmp/kdbkit-pwned')\n"),
     f"member '{MODULE}/evil.pth' is not part of a kernel package"),
    (_with_member(f"{MODULE}-{__version__}.data/purelib/evil.pth", b"import os\n"),
     f"member '{MODULE}-{__version__}.data/purelib/evil.pth' is outside its package folder"),
    (_replace(f"{MODULE}/__init__.py", lambda data: data + b"\nimport os\nos.system('touch /tmp/kdbkit-pwned')\n"),
     f"member '{MODULE}/__init__.py' is not the one `kdb package` writes"),
    (_with_member(f"{MODULE}/helpers.py", b"print('code of its own')\n"),
     f"member '{MODULE}/helpers.py' is not part of a kernel package"),
], ids=["console_scripts", "pth-in-package", "pth-in-data-dir", "code-in-init", "extra-module"])
def test_a_wheel_with_code_is_refused_with_nothing_installed(venv, tmp_path, alter, why):
    wheel = _packaged(tmp_path)
    _rewrite(wheel, alter)
    installer.write_sums(wheel.parent, [wheel])  # whoever altered it listed it too
    _refused(venv, wheel.parent, tmp_path, why)


ZEROS = 64 << 20


def _bomb(infos):
    """The bundle member replaced by 64 MiB of zeros (it deflates to about 64 KiB)."""
    info, _ = infos[f"{MODULE}/sm_90.kdb"]
    return {**infos, f"{MODULE}/sm_90.kdb": (info, bytes(ZEROS))}


def test_a_zip_bomb_is_refused_with_memory_bounded(venv, tmp_path):
    import zipfile

    wheel = _packaged(tmp_path)
    _rewrite(wheel, _bomb)
    installer.write_sums(wheel.parent, [wheel])
    with zipfile.ZipFile(wheel) as archive:
        assert archive.getinfo(f"{MODULE}/sm_90.kdb").compress_size < ZEROS // 100
    (candidate,) = scan(wheel.parent)
    tracemalloc.start()
    try:
        with pytest.raises(PackageError) as refused:
            installer.verify(candidate)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ZEROS // 8, f"verifying took {peak} bytes of memory"
    assert "member 'kdbkit_kernels_sm_90/sm_90.kdb' expands 67108864 bytes" in str(refused.value)
    _refused(venv, wheel.parent, tmp_path, "a zip bomb")


def test_kdb_package_refuses_a_damaged_bundle_and_writes_nothing(tmp_path):
    import sqlite3

    good, bad = _bundle(tmp_path / "good"), _bundle(tmp_path / "bad", Target("hip", "gfx942"))
    with sqlite3.connect(bad) as conn:  # an entry whose bytes no longer match their hash
        conn.execute("UPDATE kern_db SET kernel_blob = ?, uncompressed_size = 0", (b"\0" * 64,))
    done = subprocess.run(KDB + ["package", str(good), str(bad), "-o", str(tmp_path / "wheels")],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(errors) == 1 and str(bad) in errors[0], done.stderr
    assert "the bundle is damaged" in errors[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "wheels").exists()
