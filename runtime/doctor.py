"""Gather what ``kdb doctor`` reports: libraries, compilers, paths, bundles, cache health.

Every probe is wrapped so that a broken or missing library shows as a row saying so,
never as an exception: the doctor must work best exactly when something is broken.
"""

from __future__ import annotations

import platform
import sqlite3
import sys
from dataclasses import dataclass
from importlib import metadata

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
    from kdbkit.runtime.backends.spec import BACKENDS

    # Machine-local backends (OpenCL) compile per device: their compilers show with the devices.
    return [Row("compilers", what[c.name], _probe(c.identity)[0])
            for spec in BACKENDS if not spec.machine_local for c in compilers_for(spec.name)]


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
    from kdbkit.runtime.preflight import runtime_of
    from kdbkit.runtime.system_bundles import bundle_for_device

    try:
        devices = discover_devices()
    except Exception as exc:  # e.g. a malformed KDB_DEVICE_ARCH: report it, keep going
        return [Row("devices", "discovery", f"failed: {exc}", False)]
    rows = []
    dirs = paths.system_db_dirs()
    for d in devices:
        runtime = runtime_of(d.backend, d.runtime)
        used, trace = bundle_for_device(d.target, binary_format_of(d.backend), dirs, runtime)
        text = f"{d.backend} {d.name}: {d.target}" + (f" ({runtime})" if runtime.version else "") + "; "
        text += f"uses {used.path}" if used else f"missing {d.target.built_bundle_name()} (JIT and user cache only)"
        rows.append(Row("devices", f"#{d.index}", text, True))
        rows += [Row("devices", f"#{d.index} not used", f"{c.path}: {c.reason}", False)
                 for c in trace if c.status == "rejected"]
    if not rows:
        rows.append(Row("devices", "none", "no GPU and no OpenCL device; pip install 'kdbkit[opencl]'", False))
    return rows


def cache_sources() -> list[Row]:
    """The lookup chain a handle on the first device would have: each tier as it describes
    itself, then each tier's own health facts under its heading."""
    from kdbkit.runtime import cache_sources as chain
    from kdbkit.runtime.backends.registry import binary_format_of, discover_devices

    rows = [Row("find-db", "user folder", str(paths.user_db_dir()))]
    try:
        devices = discover_devices()
    except Exception as exc:  # reported by the devices section too
        return rows + [Row("cache sources", "discovery", f"failed: {exc}", False)]
    if not devices:
        return rows + [Row("cache sources", "none", "no device to assemble a lookup chain for", False)]
    device = devices[0]
    tiers = chain.survey(device.target, binary_format_of(device.backend))
    rows.append(Row("cache sources", "chain", " -> ".join(["memory", *(info.name if info else title
                                                                    for title, info, _ in tiers)])
                    + f" (for {device.target})"))
    for title, info, checks in tiers:
        if info is not None:
            written = "writable" if info.writable else "not writable"
            rows.append(Row("cache sources", info.name, f"{info.where} ({written})"))
        rows += [Row(title, c.item, c.value, c.ok) for c in checks]
    return rows


# Problems shown per file; the rest are counted (`kdb db verify FILE` lists them all).
MAX_PROBLEMS_SHOWN = 5


def bundle_entries() -> list[Row]:
    """Every installed system bundle and user cache checked as ``kdb db verify`` checks it:
    file integrity, the index against the table, and each entry bound to its key. A bundle
    that would serve a wrong or damaged entry is a problem here, not a surprise at run time."""
    from kdbkit.kdb.verify import verify_bundle

    rows = []
    for path in _installed_bundle_files() + _user_cache_files():
        report = verify_bundle(path)
        if report.ok:
            rows.append(Row("bundle entries", str(path), f"{report.entries_checked} entries, each bound to its key"))
            continue
        rows += [Row("bundle entries", str(path), problem, False) for problem in report.problems[:MAX_PROBLEMS_SHOWN]]
        if len(report.problems) > MAX_PROBLEMS_SHOWN:
            rows.append(Row("bundle entries", str(path), f"{len(report.problems) - MAX_PROBLEMS_SHOWN} more problem(s): "
                            f"run `kdb db verify {path}`", False))
    return rows


def _installed_bundle_files() -> list:
    files = []
    for d in paths.system_db_dirs():
        try:
            files += [d.path] if d.is_file and d.path.is_file() else sorted(d.path.glob("*.kdb"))
        except OSError:
            continue  # reported by the search-path section
    return files


def _user_cache_files() -> list:
    try:
        return sorted(paths.user_cache_dir().glob("*.ukdb"))
    except (OSError, KdbError):
        return []  # reported by the user cache's own checks


def report() -> list[Row]:
    """Every row of the doctor's report, in display order."""
    rows: list[Row] = []
    for part in (versions, compilers, search_paths, devices_and_bundles, bundle_entries, cache_sources):
        try:
            rows += part()
        except Exception as exc:  # one failing section must not hide the others
            rows.append(Row(part.__name__, "error", f"{type(exc).__name__}: {exc}", False))
    rows.append(Row("environment", "python", sys.executable))
    return rows
