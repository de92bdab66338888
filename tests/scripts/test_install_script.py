"""scripts/install_precompiled_kernels.sh: `kdb install` for a shell user, with its own checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.packager.test_packages import _bundle

SCRIPT = Path(__file__).parents[2] / "scripts" / "install_precompiled_kernels.sh"


def _script(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_the_script_chooses_for_a_named_target_and_passes_options_through(tmp_path):
    _bundle(tmp_path / "packages")
    done = _script(str(tmp_path / "packages"), "--target", "sm_90_132", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    (device,) = json.loads(done.stdout)["devices"]
    assert Path(device["chosen"]).name == "sm_90.kdb" and device["installed"] is None
    by_env = _script("--target", "sm_90_132", "--dry-run", KDB_KERNEL_PACKAGES=str(tmp_path / "packages"))
    assert by_env.returncode == 0 and "would install" in by_env.stdout


def test_the_script_names_what_is_missing(tmp_path):
    assert "no package folder" in _script(KDB_KERNEL_PACKAGES="").stderr
    missing = _script(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "is not a folder" in missing.stderr
    no_kdbkit = _script(str(tmp_path), PYTHON="/usr/bin/false")
    assert no_kdbkit.returncode == 2 and "kdbkit is not installed" in no_kdbkit.stderr
