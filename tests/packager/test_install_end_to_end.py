"""The user's whole job on a machine with no GPU: run a program once with its calls logged,
build its programs for sm_80, sm_90, gfx90a, gfx942 and the local PoCL device, tune the PoCL
device, package every bundle as a wheel, install into a fresh virtual environment, and run the
program there with JIT forbidden: every program comes from the installed package's bundle, and
the ranking from its find-db."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.prerequisites import require_amdgcn_clang, require_nvrtc
from tests.runtime.chain_fixtures import KDB_VARS_TO_CLEAR

RUN = Path(__file__).with_name("installed_run.py")
KDB = [sys.executable, "-c", "import sys; from kdbkit.runtime.cli.app import main; sys.exit(main())"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KDB_VARS_TO_CLEAR and not k.startswith("KDB_")}
    env.update({"KDB_CUSTOM_CACHE_DIR": str(tmp_path / "cache"), "KDB_USER_DB_PATH": str(tmp_path / "userdb"),
                "KDB_BACKEND": "opencl", **extra})  # PoCL unless the caller names another
    return env


def _run(command, env, cwd=None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command[-3:]} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _fresh_venv(path: Path) -> Path:
    """A new virtual environment that sees this one's packages (kdbkit, its dependencies, pip)
    through a .pth file, but installs into its own site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    Path(site, "outer_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


@pytest.mark.slow
def test_log_build_tune_package_install_into_a_fresh_venv_and_run_with_no_jit(tmp_path):
    require_amdgcn_clang()
    require_nvrtc()
    # 1. The program once, with its calls logged: the catalogue.
    log = tmp_path / "calls.log"
    first = _run([sys.executable, str(RUN)], _env(tmp_path / "first", KDB_ENABLE_LOGGING_CMD="1"))
    log.write_text(first.stderr)
    ran = json.loads(first.stdout)
    assert ran["resolved"] == {"jit": 3}
    local = ran["target"]  # the PoCL device the program ran on

    # 2. Bundles for four GPUs with no GPU here, and for the local PoCL device.
    built = json.loads(_run(KDB + ["build", "-c", str(log), "-o", str(tmp_path / "bundles"), "--json",
                                   "--target", "sm_80_108", "--target", "sm_90_132", "--target", "gfx90a_110",
                                   "--target", "gfx942_304", "--target", local], _env(tmp_path)).stdout)
    arch = local.rsplit("_", 1)[0]
    assert sorted(built["bundles"]) == sorted(["sm_80", "sm_90", "gfx90a", "gfx942", arch]) and not built["failed"]

    # 3. Tuned on the device, packaged with its find-db.
    tuned = json.loads(_run(KDB + ["tune", "-c", str(log), "-o", str(tmp_path / "tuned"), "--json"],
                            _env(tmp_path)).stdout)
    assert tuned["tuned"] == 3 and Path(tuned["find_db"]).name == f"{local}.fdb"
    bundles = sorted(str(p) for p in (tmp_path / "bundles").glob("*.kdb"))
    packaged = json.loads(_run(KDB + ["package", *bundles, "--find-db", tuned["find_db"], "-o", str(tmp_path / "wheels"),
                                      "--json"], _env(tmp_path)).stdout)
    assert len(packaged["wheels"]) == 5

    # 4. Installed into a fresh virtual environment: the local device's package only.
    python = _fresh_venv(tmp_path / "venv")
    kdb = [str(python)] + KDB[1:]
    report = json.loads(_run(kdb + ["install", "--from", str(tmp_path / "wheels"), "--json"], _env(tmp_path)).stdout)
    mine = next(d for d in report["devices"] if d["device"] == local)
    assert Path(mine["chosen"]).name.startswith(f"kdbkit_kernels_{arch.replace('-', '_')}_") and mine["installed"] == "pip"
    assert not (Path(sysconfig.get_path("purelib")) / "kdbkit_kernels").exists()  # this environment untouched

    # 5. The program again, in the fresh environment, with JIT forbidden and an empty cache.
    again = json.loads(_run([str(python), str(RUN), str(log)], _env(tmp_path / "second", KDB_DISABLE_JIT="1")).stdout)
    assert again["resolved"] == {"system": 3}
    assert all(err < 1e-5 for err in again["errors"].values()), again["errors"]
    (bundle, origin), = again["bundle"]
    assert str(tmp_path / "venv") in bundle and origin.startswith("package kdbkit")
    assert again["find_db"] == [str(Path(bundle).parent / f"{local}.fdb")]
