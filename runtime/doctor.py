"""Gather what ``kdb doctor`` reports: libraries, compilers, paths, bundles, cache health.

Every probe is wrapped so that a broken or missing library shows as a row saying so,
never as an exception: the doctor must work best exactly when something is broken.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.version import __version__
from kdbkit.runtime import paths


@dataclass
class Row:
    section: str
    item: str
    value: str
    ok: bool = True


DISTRIBUTIONS = ("numpy", "zstandard", "sqlite-utils", "typer", "platformdirs", "filelock", "cuda-bindings",
                 "nvidia-cuda-nvrtc", "nvidia-ml-py", "pyopencl", "pocl-binary-distribution", "hip-python", "amdsmi")


_OPTIONAL = {"cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-ml-py", "pyopencl", "pocl-binary-distribution",
             "hip-python", "amdsmi"}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _probe(fn) -> tuple[str, bool]:
    try:
        return str(fn()), True
    except Exception as exc:  # the doctor reports failures; it does not raise them
        return f"unavailable: {exc}", False


def versions() -> list[Row]:
    rows = [Row("versions", "kdbkit", __version__), Row("versions", "python", platform.python_version()),
            Row("versions", "sqlite", sqlite3.sqlite_version)]
    for dist in DISTRIBUTIONS:
        v = _dist_version(dist)
        rows.append(Row("versions", dist, v or "not installed", v is not None or dist in _OPTIONAL))
    return rows


def compilers() -> list[Row]:
    from kdbkit.runtime.compilers import compilers_for

    # A missing compiler is a fact to show, not a problem: bundles and caches work without one.
    what = {"nvrtc": "NVRTC (CUDA JIT and offline)", "hiprtc": "hiprtc (HIP JIT)",
            "clang": "clang for amdgcn (HIP offline)"}
    return [Row("compilers", what[c.name], _probe(c.identity)[0]) for b in ("cuda", "hip") for c in compilers_for(b)]


def search_paths() -> list[Row]:
    from kdbkit.kdb import open_bundle

    rows = []
    for d in paths.system_db_dirs():
        where = f"{d.path} ({d.origin})"
        if d.is_file:
            try:
                with open_bundle(d.path) as b:
                    rows.append(Row("system bundles", where, f"bundle file for {b.metadata.target}"))
            except KdbError as exc:
                rows.append(Row("system bundles", where, exc.problem, False))
        elif d.path.is_dir():
            rows.append(Row("system bundles", where, f"{len(list(d.path.glob('*.kdb')))} bundle(s)"))
        elif d.path.exists():
            rows.append(Row("system bundles", where, "not a folder or a .kdb file", False))
        else:
            # a folder nobody created is normal (no package installed there); one named in
            # KDB_SYSTEM_DB_PATH is a setting pointing nowhere
            rows.append(Row("system bundles", where, "does not exist", d.origin != "KDB_SYSTEM_DB_PATH"))
    return rows


def devices_and_bundles() -> list[Row]:
    from kdbkit.runtime.backends.registry import binary_format_of, discover_devices
    from kdbkit.runtime.system_bundles import bundle_for_device

    try:
        devices = discover_devices()
    except Exception as exc:  # e.g. a malformed KDB_DEVICE_ARCH: report it, keep going
        return [Row("devices", "discovery", f"failed: {exc}", False)]
    rows = []
    dirs = paths.system_db_dirs()
    for d in devices:
        used, trace = bundle_for_device(d.target, binary_format_of(d.backend), dirs)
        text = f"{d.backend} {d.name}: {d.target}; "
        text += f"uses {used.path}" if used else f"missing {d.target.built_bundle_name()} (JIT and user cache only)"
        rows.append(Row("devices", f"#{d.index}", text, True))
        rows += [Row("devices", f"#{d.index} not used", f"{c.path}: {c.reason}", False)
                 for c in trace if c.status == "rejected"]
    if not rows:
        rows.append(Row("devices", "none", "no GPU and no OpenCL device; pip install 'kdbkit[opencl]'", False))
    return rows


def cache_health() -> list[Row]:
    from kdbkit.runtime import cache_admin, env

    folder = paths.user_cache_dir()
    rows = [Row("user cache", "folder", str(folder)),
            Row("user cache", "enabled", "no (KDB_DISABLE_CACHE)" if env.get_bool("KDB_DISABLE_CACHE") else "yes")]
    writable, why = folder_writable(folder)
    rows.append(Row("user cache", "writable", f"{'yes' if writable else 'NO'} ({why})", writable))
    for f in cache_admin.list_cache(folder) if folder.is_dir() else []:
        rows.append(Row("user cache", f.path.name, f.problem or f"{f.entries} entries, {f.file_bytes} bytes",
                        f.problem is None))
    rows.append(Row("user cache", "find-db folder", str(paths.user_db_dir())))
    return rows


def folder_writable(folder: Path) -> tuple[bool, str]:
    """Whether files can be created in ``folder`` (made first if missing), and what decided it.

    The nearest existing ancestor must be a folder this process may write and enter: a
    regular file on the way means the folder can never be made.
    """
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return False, f"{probe} is a file, so {folder} cannot be created"
    if not os.access(probe, os.W_OK | os.X_OK):
        return False, f"{probe} is not writable"
    return True, str(probe)


def report() -> list[Row]:
    """Every row of the doctor's report, in display order."""
    rows: list[Row] = []
    for part in (versions, compilers, search_paths, devices_and_bundles, cache_health):
        try:
            rows += part()
        except Exception as exc:  # one failing section must not hide the others
            rows.append(Row(part.__name__, "error", f"{type(exc).__name__}: {exc}", False))
    rows.append(Row("environment", "python", sys.executable))
    return rows
