"""Inspect and maintain the user kernel cache folder (``kdb cache ...``).

The folder holds one ``<arch>.ukdb`` per arch (plus SQLite's ``-wal``/``-shm`` files while
in use), ``locks/`` with one lock file per program ever compiled, ``pocl/`` with PoCL's own
kernel cache (runtime/pocl_cache.py), and, after a repair, damaged files moved aside as
``*.ukdb.corrupt-<time>``. Its parent holds the folders of
other kdbkit versions, which this version never reads.

Every file is handled whatever it holds: one that is damaged, not a cache, or of a format this
version does not read is removed by ``clear`` and ``prune`` (and reported), never a traceback.

Everything here is safe while other processes use the cache: entries are removed through
SQLite (never by deleting a live file or its ``-wal``/``-shm``, which would corrupt the
database under its readers), and a lock file is removed only while this process holds it.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from kdbkit.kdb import Bundle, KdbError, open_bundle
from kdbkit.kdb.errors import BundleBusyError, EmptyBundleError
from kdbkit.kdb.target import USER_SUFFIX
from kdbkit.kdb.version import __version__
from kdbkit.runtime import env, paths
from kdbkit.runtime.user_cache import LOCKS, damaged, with_backoff

ASIDE_AGE_S = 86400.0  # `prune` keeps a moved-aside file this long, for a look at what went wrong


@dataclass
class CacheFile:
    path: Path
    entries: int | None
    file_bytes: int
    raw_bytes: int | None
    target: str | None
    compiler: str | None
    problem: str | None = None


@dataclass
class PruneReport:
    removed_files: list[Path] = field(default_factory=list)
    removed_entries: int = 0
    freed_bytes: int = 0


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def list_cache(folder: Path | None = None) -> list[CacheFile]:
    """Every ``.ukdb`` in the cache folder with its entry count and sizes."""
    folder = folder or paths.user_cache_dir()
    files = []
    for path in sorted(folder.glob("*.ukdb")):
        size = sum(_size(Path(str(path) + s)) for s in ("", "-wal", "-shm"))
        try:
            with open_bundle(path) as b:
                st, md = b.stats(), b.metadata
            files.append(CacheFile(path, st.entries, size, st.raw_bytes, str(md.target), md.compiler))
        except Exception as exc:
            if not (isinstance(exc, KdbError) or damaged(exc)):
                raise
            files.append(CacheFile(path, None, size, None, None, None, _problem(exc)))
    return files


@dataclass
class ClearReport:
    entries: int = 0  # entries deleted from live cache files
    removed_files: list[Path] = field(default_factory=list)  # damaged files and unused locks
    busy_locks: int = 0  # lock files left because a compile holds them now
    freed_bytes: int = 0


def clear_cache(folder: Path | None = None, *, find_db_folder: Path | None = None) -> ClearReport:
    """Empty the cache folder, safely while other processes use it.

    Live ``.ukdb`` files are emptied through SQLite (their metadata stays, so processes that
    have them open go on, compiling again what they need); damaged files and moved-aside
    copies are deleted with their ``-wal``/``-shm`` (no process can use those); a file with no
    tables yet is being created by another process and is left to it; lock files are deleted
    unless a compile holds them now; PoCL's kernel cache in ``pocl/`` is emptied. In
    ``find_db_folder`` (the user find-db's), damaged or other-format ``.ufdb`` files and
    moved-aside ones are removed; good rankings are kept (they are not a cache).
    """
    folder = folder or paths.user_cache_dir()
    report = ClearReport()
    if find_db_folder is not None:
        _remove_bad_find_dbs(find_db_folder, report)
    for path in sorted(folder.glob("*.ukdb")):
        try:
            with Bundle.open(path, writable=True, wal=True) as b:
                report.entries += with_backoff(b.delete_all)
                try:
                    b.compact()
                except BundleBusyError:
                    pass  # readers hold the file: its pages are reused by later writes instead
        except EmptyBundleError:
            continue  # its creator holds it open: deleting it now would break that process's database
        except Exception as exc:
            if damaged(exc):
                _remove_with_journals(path, report)
            elif not isinstance(exc, KdbError):
                raise
            # else busy or unwritable: left as it is, and the entries count says nothing was emptied
    _remove_moved_aside(folder, report)
    _remove_startup_memo(folder, report)
    _empty_pocl_cache(folder, report)
    report.busy_locks = _remove_unheld_locks(folder / LOCKS, report, older_than=None)
    return report


def _empty_pocl_cache(folder: Path, report: ClearReport) -> None:
    """Delete what PoCL's kernel cache holds in ``<folder>/pocl`` (runtime/pocl_cache.py), the
    folder itself kept (PoCL takes only a folder that exists). PoCL writes each entry to a
    temporary file and renames it, and a process reading one keeps it open: both go on."""
    from kdbkit.runtime import pocl_cache

    top = pocl_cache.folder(folder)
    if not top.is_dir():
        return
    for entry in sorted(top.iterdir()):
        size = _size(entry)
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # gone meanwhile, or being written: left to the next clear
        report.freed_bytes += size
        report.removed_files.append(entry)


def _remove_startup_memo(folder: Path, report: ClearReport | PruneReport, *, temps_older_than: float | None = None) -> None:
    """The startup memo (runtime/startup_memo.py; the next handle writes it again) and the
    temporary files of its writes that a killed process left; with ``temps_older_than``, only
    those temporaries, and only if older (a process may be writing one now)."""
    from kdbkit.runtime import startup_memo

    candidates = sorted(folder.glob(f"{startup_memo.TEMP_PREFIX}*"))
    if temps_older_than is None:
        candidates.append(folder / startup_memo.FILE_NAME)
    for path in candidates:
        try:
            if temps_older_than is not None and path.stat().st_mtime >= temps_older_than:
                continue
            size = path.stat().st_size
            path.unlink()
        except OSError:
            continue
        report.freed_bytes += size
        report.removed_files.append(path)


def _remove_with_journals(path: Path, report: ClearReport | PruneReport) -> None:
    """Delete a file no process can use (damaged, or moved aside) and its SQLite journals."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        if p.exists():
            report.freed_bytes += _size(p)
            p.unlink(missing_ok=True)
            report.removed_files.append(p)


def _remove_moved_aside(folder: Path, report: ClearReport | PruneReport, older_than: float | None = None,
                        suffix: str = USER_SUFFIX) -> None:
    """Delete the damaged files the runtime moved aside (``*<suffix>.corrupt-<time>``), with
    ``older_than`` only those not touched since."""
    for aside in sorted(folder.glob(f"*{suffix}.corrupt-*")):
        try:
            if older_than is not None and aside.stat().st_mtime >= older_than:
                continue
        except OSError:
            continue
        _remove_with_journals(aside, report)


def _remove_bad_find_dbs(folder: Path, report: ClearReport | PruneReport, older_than: float | None = None) -> None:
    """Delete user find-db files no process can use (damaged, or of another schema) and, with
    ``older_than``, only moved-aside ones untouched since."""
    from kdbkit.kdb import find_db

    for path in sorted(folder.glob(f"*{find_db.USER_SUFFIX}")):
        if not _find_db_readable(path):
            _remove_with_journals(path, report)
    _remove_moved_aside(folder, report, older_than, suffix=find_db.USER_SUFFIX)


def _find_db_readable(path: Path) -> bool:
    """Whether a user find-db is one this version reads (an empty one is being created: kept)."""
    import sqlite3
    from contextlib import closing

    from kdbkit.kdb import find_db

    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                return True
            schema = conn.execute("SELECT value FROM find_meta WHERE key = 'schema'").fetchone()
            conn.execute("SELECT count(*) FROM find_db").fetchone()
    except sqlite3.Error:
        return False
    return schema is not None and schema[0] == str(find_db.SCHEMA_VERSION)


def _problem(exc: BaseException) -> str:
    return exc.problem if isinstance(exc, KdbError) else f"{type(exc).__name__}: {exc}"


def _remove_unheld_locks(locks: Path, report, older_than: float | None) -> int:
    """Delete lock files no compile holds (and untouched since ``older_than``); count the held ones.

    Each is taken without waiting before it is deleted, so a compile holding it keeps it.
    """
    held = 0
    for lock_path in sorted(locks.glob("*.lock")) if locks.is_dir() else ():
        try:
            if older_than is not None and lock_path.stat().st_mtime >= older_than:
                continue
            lock = FileLock(str(lock_path), timeout=0)
            with lock:
                lock_path.unlink(missing_ok=True)
            report.removed_files.append(lock_path)
        except Timeout:
            held += 1
        except OSError:
            continue  # gone meanwhile, or not ours to delete
    return held


def prune_cache(folder: Path | None = None, *, lock_age_s: float = 7 * 86400,
                find_db_folder: Path | None = None) -> PruneReport:
    """Drop what this version can no longer use, then compact.

    Removes: cache folders of other kdbkit versions (only under the default location, never
    under ``KDB_CUSTOM_CACHE_DIR``'s parent); damaged files moved aside more than
    :data:`ASIDE_AGE_S` ago; cache files that are damaged, not caches, or of a format this
    version does not read; lock files untouched for ``lock_age_s``; entries that fail their
    hash check. Then VACUUMs each file. In ``find_db_folder``: damaged or other-schema ``.ufdb``
    files, and moved-aside ones as old as above.

    Raises:
        ValueError: ``lock_age_s`` is negative or NaN (every idle lock would count as old).
    """
    if not lock_age_s >= 0:
        raise ValueError(f"lock_age_s is {lock_age_s}: give an age of 0 seconds or more")
    custom = env.get_path("KDB_CUSTOM_CACHE_DIR") is not None
    folder = folder or paths.user_cache_dir()
    report = PruneReport()
    if not custom and folder.name == __version__ and folder.parent.is_dir():
        for other in folder.parent.iterdir():
            if other.is_dir() and other != folder:
                report.freed_bytes += _size(other)
                shutil.rmtree(other, ignore_errors=True)
                report.removed_files.append(other)
    _remove_moved_aside(folder, report, older_than=time.time() - ASIDE_AGE_S)
    if find_db_folder is not None:
        _remove_bad_find_dbs(find_db_folder, report, older_than=time.time() - ASIDE_AGE_S)
    _remove_startup_memo(folder, report, temps_older_than=time.time() - 3600)
    _remove_unheld_locks(folder / LOCKS, report, older_than=time.time() - lock_age_s)
    for path in folder.glob("*.ukdb"):
        report.removed_entries += _drop_corrupt_entries(path, report)
    return report


def _drop_corrupt_entries(path: Path, report: PruneReport) -> int:
    before = _size(path)
    try:
        with Bundle.open(path, writable=True, wal=True) as b:
            removed = 0
            for info in list(b.entries()):
                try:
                    b.get(info.kernel_name, info.kernel_args)
                except KdbError:
                    removed += b.delete(info.kernel_name, info.kernel_args)
            b.compact()
    except EmptyBundleError:
        return 0  # its creator holds it open
    except Exception as exc:
        if damaged(exc):
            _remove_with_journals(path, report)  # no process can use it: each would move it aside
        elif not isinstance(exc, KdbError):
            raise
        return 0
    report.freed_bytes += max(0, before - _size(path))
    return removed
