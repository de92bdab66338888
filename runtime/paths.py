"""Where kdbkit looks for system bundles and keeps its per-user files.

System bundles (read-only), searched in this order:
1. ``KDB_SYSTEM_DB_PATH`` (a path list of folders, or of ``.kdb`` files named directly);
2. ``<sys.prefix>/share/kdbkit/db``;
3. installed kernel packages: entry points in group ``kdbkit.bundles`` whose value names the
   import folder holding the ``.kdb`` files, found beside the distribution and never imported.

Per-user files live in a folder per kdbkit version, as MIOpen's do, so an upgrade never
reads a cache written by an older release: ``KDB_CUSTOM_CACHE_DIR`` or the platform's
user cache folder (``~/.cache/kdbkit/<version>``) for ``.ukdb`` kernel caches;
``KDB_USER_DB_PATH`` or the platform's user data folder for the find-db.
Nothing is created here; callers create folders when they first write.

A ``KDB_SYSTEM_DB_PATH`` entry (or the folder of a bundle it names) owned by a user other than
this one or root, or writable by group or others, is skipped with one warning: whoever can
write it chooses the binaries this process runs (runtime/private_folder.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from kdbkit.kdb.version import __version__
from kdbkit.runtime import env
from kdbkit.runtime.logging_setup import get_logger, warn_once

ENTRY_POINT_GROUP = "kdbkit.bundles"
_log = get_logger(__name__)


@dataclass(frozen=True)
class SearchDir:
    """A folder searched for system bundles (or one bundle file named directly) and why."""

    path: Path
    origin: str  # "KDB_SYSTEM_DB_PATH", "package <name>", "sys.prefix"
    is_file: bool = False  # a bundle file, not a folder: only KDB_SYSTEM_DB_PATH names those


def iter_system_db_dirs() -> Iterator[SearchDir]:
    """Folders searched for system bundles, in order, duplicates removed, made lazily.

    Installed packages are asked (an entry-point scan of every installed distribution,
    milliseconds in a large environment) only once the folders before them are exhausted.
    """
    seen = set()

    def fresh(dirs):
        for d in dirs:
            path = d.path.expanduser()
            key = os.path.abspath(path)  # not resolve(): no syscalls; a symlinked twin is only searched twice
            if key not in seen:
                seen.add(key)
                yield SearchDir(path, d.origin, d.is_file)

    yield from fresh(SearchDir(p, "KDB_SYSTEM_DB_PATH", p.suffix == ".kdb" or os.path.isfile(p))
                     for p in env.get_pathlist("KDB_SYSTEM_DB_PATH") if _trusted_system_path(p.expanduser()))
    yield from fresh([SearchDir(Path(sys.prefix) / "share" / "kdbkit" / "db", "sys.prefix")])
    yield from fresh(_entry_point_dirs())


def _trusted_system_path(path: Path) -> bool:
    """Whether a ``KDB_SYSTEM_DB_PATH`` entry, and the folder of a file it names, may be read:
    each that exists is owned by this user or root and not writable by group or others."""
    from kdbkit.runtime import private_folder

    for level in (path, path.parent) if path.suffix == ".kdb" or os.path.isfile(path) else (path,):
        why = private_folder.untrusted(level)
        if why:
            warn_once(f"unsafe-system-db:{level}", f"KDB_SYSTEM_DB_PATH entry {path} is skipped: {why}.", logger=_log)
            return False
    return True


def system_db_dirs() -> list[SearchDir]:
    """Every folder searched for system bundles, in order (see :func:`iter_system_db_dirs`)."""
    return list(iter_system_db_dirs())


_entry_points_seen: tuple[tuple, list[SearchDir]] | None = None  # (sys.path and its folders' stamps, the folders)


def _entry_point_dirs() -> Iterator[SearchDir]:
    """:func:`_scan_entry_points`, remembered while ``sys.path`` and its folders are unchanged
    (an install changes a folder's mtime): in this process, since a handle's bundle search and
    its find-db both ask, and in the startup memo for the next one, since a large
    site-packages takes milliseconds to scan (a memo whose folders are gone is not used)."""
    global _entry_points_seen
    stamps = []
    for entry in sys.path:
        try:
            st = os.stat(entry or ".")
            # "" is the working folder: named by its path, so that another folder's stamps never match
            stamps.append((entry or os.path.abspath("."), st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            stamps.append((entry or os.path.abspath("."), None, None))
    key = tuple(stamps)
    if _entry_points_seen is None or _entry_points_seen[0] != key:
        from kdbkit.runtime import startup_memo

        memo, memo_key = startup_memo.memo(), json.dumps(stamps)
        remembered = memo.section("entry_points").get(memo_key)
        found = None
        if isinstance(remembered, list) and all(isinstance(d, list) and len(d) == 2 for d in remembered):
            found = [SearchDir(Path(path), origin) for path, origin in remembered]
            if not all(d.path.is_dir() for d in found):
                found = None
        if found is None:
            found = list(_scan_entry_points())
            memo.put("entry_points", memo_key, [[str(d.path), d.origin] for d in found])
        _entry_points_seen = (key, found)
    return iter(_entry_points_seen[1])


def _scan_entry_points() -> Iterator[SearchDir]:
    """Folders named by installed kernel packages (entry-point group ``kdbkit.bundles``)."""
    for package in iter_kernel_packages():
        yield SearchDir(package.folder, f"package {package.dist}")


@dataclass(frozen=True)
class KernelPackage:
    """An installed kernel package as the runtime finds it: its distribution's name (as the scan
    spells it), its ``.dist-info`` folder and the import folder holding its bundles."""

    dist: str
    dist_info: Path
    folder: Path


def iter_kernel_packages(entries: Iterable[str] | None = None) -> Iterator[KernelPackage]:
    """The kernel packages installed in ``entries`` (default ``sys.path``), in the runtime's order.

    Reads each distribution's ``entry_points.txt`` directly instead of through
    ``importlib.metadata``, whose import alone costs far more than the scan: this runs in
    every process that finds no bundle earlier in the search, on the way to its first result.
    Nothing is imported: a package is data (see :func:`_load_entry_points`). ``kdb lock`` and
    ``kdb doctor --locked`` read the packages through this too, so they see what the runtime sees.
    """
    seen = set()
    for entry in sys.path if entries is None else entries:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            # "<name>-<version>.dist-info": wheel metadata folders spell the name without dashes
            dist = name.rsplit(".", 1)[0].split("-", 1)[0].lower()
            if dist in seen:
                continue  # the first on sys.path wins, as with importlib.metadata
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", name, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            if f"[{ENTRY_POINT_GROUP}]" in text:
                site = Path(entry or ".")
                for folder in _load_entry_points(text, dist, site, name):
                    yield KernelPackage(dist, site / name, folder)


def _load_entry_points(text: str, dist: str, site: Path, dist_info: str) -> Iterator[Path]:
    """The folders a distribution's ``kdbkit.bundles`` entry points name, found without importing.

    A value names an import folder (``kdbkit_kernels_sm_90``; ``module:bundle_dir`` as packages
    from kdbkit 0.1.0 wrote it, whose function returned that same folder): the folder is
    ``<site>/<module>/``, beside the ``.dist-info``, and must be one the distribution installed
    (its ``RECORD`` lists files in it). Importing the module would run a package's code in every
    process that makes a handle; reading a folder runs none, and its bundles are verified as read.
    """
    section = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line == f"[{ENTRY_POINT_GROUP}]"
            continue
        if not section or "=" not in line or line.startswith(("#", ";")):
            continue
        ep_name, value = (part.strip() for part in line.split("=", 1))
        module = value.partition(":")[0].strip()
        why = _unowned_folder(module, site, dist_info)
        if why:  # a broken kernel package must not stop the runtime
            _log.warning("kernel package %s: entry point %s = %s %s; its bundles are skipped. Reinstall that "
                         "package with `kdb install`.", dist, ep_name, value, why)
            continue
        yield site.joinpath(*module.split("."))


def _unowned_folder(module: str, site: Path, dist_info: str) -> str:
    """Why ``module`` names no folder of this distribution ("" when it does)."""
    parts = module.split(".")
    if not module or not all(p.isidentifier() for p in parts):
        return "names no import folder"
    folder = site.joinpath(*parts)
    if not folder.is_dir():
        return f"names {folder}, which is not a folder"
    try:
        with open(site / dist_info / "RECORD", encoding="utf-8") as f:
            record = f.read()
    except FileNotFoundError:
        return ""  # a distribution laid out by hand (a development tree): the folder is all there is
    except OSError as exc:
        return f"has an unreadable RECORD ({exc.strerror or exc})"
    prefix = "/".join(parts) + "/"
    if not any(line.startswith(prefix) for line in record.splitlines()):
        return f"names {folder}, which the distribution did not install"
    return ""


def import_platformdirs_in_background() -> None:
    """Import platformdirs on a worker thread when a per-user folder will come from it (neither
    KDB_CUSTOM_CACHE_DIR nor KDB_USER_DB_PATH set): called as a device opens, which takes far
    longer and mostly outside the GIL, so that a user who sets nothing does not pay for the
    import on the first handle and call. A later import waits on the same module lock, never
    imports twice; a failure here is left for that import to report."""
    if "platformdirs" in sys.modules or (env.any_set("KDB_CUSTOM_CACHE_DIR") and env.any_set("KDB_USER_DB_PATH")):
        return
    threading.Thread(target=_import_platformdirs, name="kdbkit-import-platformdirs", daemon=True).start()


def _import_platformdirs() -> None:
    try:
        importlib.import_module("platformdirs")
    except Exception as exc:  # the import on the path that needs it raises, with its own message
        _log.debug("platformdirs not imported in the background: %s", exc)


def user_cache_dir() -> Path:
    """Folder of the user kernel caches (``.ukdb``)."""
    custom = env.get_path("KDB_CUSTOM_CACHE_DIR")
    if custom is not None:
        return custom.expanduser()
    import platformdirs  # deferred: only needed once a cache is actually opened

    return platformdirs.user_cache_path("kdbkit") / __version__


def user_db_dir() -> Path:
    """Folder of the user find-db (solver rankings)."""
    custom = env.get_path("KDB_USER_DB_PATH")
    if custom is not None:
        return custom.expanduser()
    import platformdirs

    return platformdirs.user_data_path("kdbkit") / __version__
