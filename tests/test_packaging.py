"""Installed, kdbkit is one import name (the direction of imports: tests/test_layering.py).

The wheel is built from this checkout and installed into a fresh virtual environment (its
dependencies borrowed from the test's own environment through a ``.pth`` file, so no network
is needed), then used from a folder outside the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"kdb": "kdbkit.kdb", "runtime": "kdbkit.runtime", "packager": "kdbkit.packager"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the dev extra installs setuptools, so no backend is fetched.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("kdbkit-*.whl")
    return path


def test_every_package_folder_is_listed_and_in_the_wheel(wheel):
    """setuptools cannot find packages below a mapped prefix (and a setup.py would add to the top
    level the design card fixes), so pyproject.toml lists every package: a folder missing from
    the list is named here with the line to add, and the wheel holds exactly the folders."""
    setuptools = _pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"]["kdbkit"] == "runtime/_kdbkit"
    found = {"kdbkit"}
    for folder, name in MAPPED.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if rel.parts[:1] != ("_kdbkit",) and "__pycache__" not in rel.parts:
                found.add(".".join((name, *rel.parts)))
    listed = set(setuptools["packages"]) - {"kdbkit.kernels"}  # kernels/ is data, listed to ship it
    missing = sorted(found - listed)
    assert not missing, "add to [tool.setuptools] packages in pyproject.toml: " + ", ".join(f'"{m}"' for m in missing)
    assert not listed - found, f"pyproject.toml lists packages with no folder: {sorted(listed - found)}"
    in_wheel = {n.removesuffix("/__init__.py").replace("/", ".") for n in zipfile.ZipFile(wheel).namelist()
                if n.endswith("/__init__.py") or n == "kdbkit/__init__.py"}
    assert in_wheel == found


def test_the_wheel_holds_one_top_level_name_and_the_kernels(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/", 1)[0] for n in names if ".dist-info/" not in n} == {"kdbkit"}
    assert "kdbkit/kernels/kdb_compat.h" in names and "kdbkit/kernels/activation.c" in names
    assert "kdbkit/runtime/compilers/nvrtc.py" in names and "kdbkit/__init__.py" in names
    assert not any(n.startswith("kdbkit/runtime/_kdbkit") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "kdb = kdbkit.runtime.cli.app:main" in entry_points


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # Without this environment's PYTHONPATH, and ignoring what is installed elsewhere: pip must
    # put the wheel into the fresh environment even where kdbkit is importable already.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--ignore-installed", str(wheel)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies (numpy, zstandard, pyopencl, ...) come from this environment's import
    # path, the checkout left out; a path added by a .pth file is not scanned for .pth files,
    # so this environment's editable kdbkit stays out of sight.
    outer = [p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != ROOT]
    (site / "kdbkit-test-deps.pth").write_text("\n".join([sysconfig.get_path("purelib"), *outer]) + "\n")
    return env_dir


def _run(env_dir: Path, *cmd: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KDB_") and k != "PYTHONPATH"}
    return subprocess.run([str(env_dir / "bin" / cmd[0]), *cmd[1:]], cwd=cwd, capture_output=True, text=True,
                          env={**clean, **env}, timeout=600)


@pytest.mark.slow  # a fresh virtual environment
def test_installed_it_owns_exactly_one_top_level_import_name(fresh_venv, tmp_path):
    record = next((fresh_venv / "lib").glob("python*/site-packages/kdbkit-*.dist-info/RECORD")).read_text()
    tops = {line.split(",", 1)[0].split("/", 1)[0] for line in record.splitlines()}
    assert {t for t in tops if not t.endswith(".dist-info") and t != ".."} == {"kdbkit"}
    site = next((fresh_venv / "lib").glob("python*/site-packages"))
    assert {p.name for p in site.iterdir()} - {"kdbkit-test-deps.pth"} == {"kdbkit", record_dist(site)}
    proc = _run(fresh_venv, "python", "-c", "import kdbkit; print(kdbkit.__file__)", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith(str(site)), proc.stderr


def record_dist(site: Path) -> str:
    (dist,) = site.glob("kdbkit-*.dist-info")
    return dist.name


@pytest.mark.slow  # a fresh virtual environment
def test_import_kdbkit_has_no_side_effects_and_exposes_the_api(fresh_venv, tmp_path):
    probe = ("import sys, logging, kdbkit; loaded = sorted(m for m in sys.modules if m.startswith('kdbkit')); "
             "print(loaded, len(logging.getLogger('kdbkit').handlers)); "
             "print(kdbkit.Handle.__module__, kdbkit.open_bundle.__module__, issubclass(kdbkit.CompileError, kdbkit.KdbError))")
    proc = _run(fresh_venv, "python", "-c", probe, cwd=tmp_path, HOME=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "['kdbkit'] 0"
    assert second == "kdbkit.runtime.handle kdbkit.kdb.bundle True"
    assert not (tmp_path / ".cache").exists()  # no folder made at import


@pytest.mark.slow  # a fresh virtual environment
def test_the_console_script_and_the_main_job_run_outside_the_checkout(fresh_venv, tmp_path):
    proc = _run(fresh_venv, "kdb", "--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().startswith("kdbkit "), proc.stderr
    proc = _run(fresh_venv, "kdb", "demo", cwd=tmp_path, HOME=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all results match NumPy" in proc.stdout and "Traceback" not in proc.stderr
