"""What making a handle learns about files, kept for the next process: each kernel file's
SHA-256 and quoted includes by the file's stamp, the folders that installed kernel
packages name, by the stamps of ``sys.path``'s folders, and the programs each system bundle
served and the problems run with it (``kdbkit.runtime.prefetch`` makes them ready again in
the background).

A handle digests the kernel files its bundle was built from and scans every installed
distribution for kernel packages: dozens to hundreds of file reads, a few milliseconds of a
fresh process's first result. With the memo, each is a stat per file or folder.

A file's stamp is (mtime, size, ctime, inode). ctime changes with every write to the file and
no tool can set it back, so content edited in place, or a file replaced by another of the
same size and mtime, never matches its old stamp. Installing or removing a distribution
changes its folder's mtime, and with it the scan's stamp.

The memo is one JSON file in the user cache folder (``startup-memo.json``), replaced
atomically. Missing, damaged or of another schema, it is ignored and written again; a folder
that cannot be written keeps nothing (at debug level in the log), and ``KDB_DISABLE_CACHE``
turns it off, like every per-user file. A cache folder that others may write is not read
(its memo could name another file's digest, and so choose a binary): the user cache warns of it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from kdbkit.runtime import env, private_folder
from kdbkit.runtime.logging_setup import get_logger

_log = get_logger(__name__)
FILE_NAME = "startup-memo.json"
TEMP_PREFIX = ".startup-memo."  # a write in progress (or left by a killed process: `kdb cache prune` removes it)
SCHEMA = 1
# Entries per section before it starts over (kdbkit's kernels are 30 files; sys.path stamps
# change with the working folder): the memo stays small enough to read in a fraction of a ms.
MAX_ENTRIES = {"sources": 1024, "entry_points": 16, "programs": 16, "problems": 16}


class StartupMemo:
    """The memo's sections (name -> JSON-able dict), read once, written back only when changed."""

    def __init__(self, path: Path | None):
        self.path = path
        self.sections: dict[str, dict[str, Any]] = {}
        self.changed = False
        self._lock = threading.Lock()
        if path is not None:
            self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            if not isinstance(exc, FileNotFoundError):
                _log.debug("startup memo %s not read (%s); it will be written again", self.path, exc)
            return
        if isinstance(data, dict) and data.get("schema") == SCHEMA and isinstance(data.get("sections"), dict):
            self.sections = {k: v for k, v in data["sections"].items() if isinstance(v, dict)}

    def section(self, name: str) -> dict[str, Any]:
        return self.sections.setdefault(name, {})

    def put(self, section: str, key: str, value: Any) -> None:
        with self._lock:
            entries = self.section(section)
            if entries.get(key) != value:
                if key not in entries and len(entries) >= MAX_ENTRIES.get(section, 1024):
                    entries.clear()  # stale paths pile up (deleted checkouts, old venvs): start over
                entries[key] = value
                self.changed = True

    def save(self) -> None:
        """Write the memo if it changed; a failure is only logged (the memo is an optimisation)."""
        with self._lock:
            if self.path is None or not self.changed:
                return
            text = json.dumps({"schema": SCHEMA, "sections": self.sections}, separators=(",", ":"))
            try:
                why = private_folder.make_private_folder(self.path.parent)
                if why:
                    raise OSError(why)
                fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self.path.parent)
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as f:
                        f.write(text)
                    os.replace(tmp, self.path)
                except BaseException:
                    os.unlink(tmp)
                    raise
                self.changed = False
            except OSError as exc:
                _log.debug("startup memo %s not written: %s", self.path, exc)


_memo: tuple[tuple, StartupMemo] | None = None  # (the variables that place it, the memo)
_memo_lock = threading.Lock()


def memo() -> StartupMemo:
    """This process's memo, read on first use and again when the cache folder's variables
    change (a memo without a file when caching is disabled)."""
    global _memo
    # the raw values, not parsed ones: this runs per kernel file a handle digests
    placed = env.raw_values("KDB_CUSTOM_CACHE_DIR", "KDB_DISABLE_CACHE")
    current = _memo
    if current is None or current[0] != placed:
        with _memo_lock:
            current = _memo = (placed, StartupMemo(_memo_path()))
    return current[1]


def _memo_path() -> Path | None:
    if env.get_bool("KDB_DISABLE_CACHE"):
        return None
    from kdbkit.runtime.paths import user_cache_dir  # paths asks this module for its scan

    folder = user_cache_dir()
    if os.path.lexists(folder) and private_folder.check_folder(folder):
        return None  # not read, not written: the user cache names the folder in its warning
    return folder / FILE_NAME


def stamp(st: os.stat_result) -> list[int]:
    """A file's or folder's stamp (see the module's docstring)."""
    return [st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino]
