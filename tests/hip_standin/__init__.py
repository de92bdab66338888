"""A stand-in HIP runtime: build it, find the hip-python lines, and run kdbkit under it.

The C sources beside this file build two shared libraries, ``libamdhip64.so`` and
``libhiprtc.so``, exporting the entry points kdbkit reaches through hip-python. A child
Python process gets one hip-python release line first on ``sys.path`` and the stand-in on
the loader's path (``LD_LIBRARY_PATH`` for hip-python 6.x/7.x, which dlopen the bare
soname; ``ROCM_PATH`` for 10.x, which looks in ``$ROCM_PATH/lib``), so the real binding
loads the stand-in as it would load ROCm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent
LINES_FILE = HERE / "hip_python_lines.txt"
_CFLAGS = ["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-format-zero-length", "-fvisibility=hidden"]
_LIBRARIES = {
    "libamdhip64.so": ["hip_runtime.c", "code_object.c", "log.c"],
    "libhiprtc.so": ["hiprtc.c", "log.c"],
}


def skip_or_fail(reason: str) -> None:
    """Skip, or fail where CI requires the stand-in tests (``KDB_TEST_REQUIRE=hip-standin``)."""
    from tests.prerequisites import skip_or_fail as skip_or_fail_for

    skip_or_fail_for("hip-standin", reason)


def build_standin(folder: Path) -> Path:
    """Compile the stand-in into ``folder/lib``; returns that folder (the ROCm ``lib`` layout)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        skip_or_fail("no C compiler (cc) to build the stand-in HIP runtime")
    lib = folder / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    for name, sources in _LIBRARIES.items():
        cmd = [cc, *_CFLAGS, "-o", str(lib / name), *(str(HERE / s) for s in sources), "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the stand-in {name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
    return lib


def hip_python_lines() -> list[str]:
    """The release lines listed in ``hip_python_lines.txt`` (``6.2``, ``6.4``, ...)."""
    lines = []
    for row in LINES_FILE.read_text().splitlines():
        row = row.strip()
        if row and not row.startswith("#"):
            lines.append(row.split()[0])
    return lines


def hip_python_folder(line: str) -> Path | None:
    """Where ``scripts/install_hip_python_lines.sh`` put that line, or ``None``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(os.environ.get("KDB_TEST_HIP_PYTHON_DIR") or cache / "kdbkit-tests" / "hip-python")
    folder = root / line
    return folder if (folder / ".installed").is_file() else None


@dataclass
class ChildRun:
    """What one child process saw (``result``) and what the stand-in logged (``calls``)."""

    result: dict
    calls: list[dict]
    stderr: str
    problems: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.problems = [c for c in self.calls if "problem" in c]

    def named(self, call: str) -> list[dict]:
        return [c for c in self.calls if c.get("call") == call and "result" in c]


def run_scenario(scenario: str, *, line_folder: Path, standin_lib: Path, work: Path,
                 env: dict[str, str] | None = None, with_standin: bool = True) -> ChildRun:
    """Run ``scenarios.py <scenario>`` in a child with one hip-python line and the stand-in.

    ``work`` holds the call log and an isolated kdbkit cache; ``env`` adds variables.
    ``with_standin=False`` leaves the stand-in off the loader's path (a machine without ROCm).
    """
    from kdbkit.runtime.compilers.amdgcn_clang import find_clang

    work.mkdir(parents=True, exist_ok=True)
    log = work / "calls.jsonl"
    log.unlink(missing_ok=True)
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("KDB_", "ROCM_", "HIP_")) and k != "LD_LIBRARY_PATH"}
    child_env.update({
        "PYTHONPATH": str(line_folder),
        "KDB_STANDIN_LOG": str(log),
        "KDB_STANDIN_LIB": str(standin_lib),
        "KDB_STANDIN_CLANG": find_clang() or "",
        "KDB_BACKEND": "hip",
        "KDB_CUSTOM_CACHE_DIR": str(work / "cache"),
        "KDB_SYSTEM_DB_PATH": str(work / "no-system-bundles"),
        "KDB_LOG_LEVEL": "3",
    })
    if with_standin:
        child_env["LD_LIBRARY_PATH"] = str(standin_lib)
        child_env["ROCM_PATH"] = str(standin_lib.parent)
    else:
        child_env["ROCM_PATH"] = str(work / "no-rocm")
    child_env.update(env or {})
    proc = subprocess.run([sys.executable, str(HERE / "scenarios.py"), scenario], capture_output=True, text=True,
                          env=child_env, cwd=work, timeout=300)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("KDB-RESULT ")]
    if proc.returncode != 0 or not marker:
        raise AssertionError(f"scenario {scenario} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    calls = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    result = json.loads(marker[-1][len("KDB-RESULT "):])
    if "scenario_error" in result:
        raise AssertionError(f"scenario {scenario} raised {result['scenario_error']}\nstderr:\n{proc.stderr}\n"
                             f"stand-in problems: {[c for c in calls if 'problem' in c]}")
    return ChildRun(result, calls, proc.stderr)
