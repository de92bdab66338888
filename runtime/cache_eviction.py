"""Keeping a user cache under a size (``KDB_CACHE_MAXSIZE``): the least recently used programs go first.

Each process notes the entries it read (in memory) and, when it stores one, writes those
notes into the file's ``kdb_use`` table (key -> last use, in seconds) in the same step that
checks the file's size: a hit on the hot path costs a set insertion, never a write. A file
over the limit loses its least recently used entries (those never noted first, then by age)
until it is under 80% of it, so that a full cache is not trimmed at every store.

Safe under concurrency: SQLite's WAL lets readers go on while entries are deleted (a read in
progress keeps its snapshot, and a program once loaded lives in its process's memory), the
entry just stored is never the one evicted, and deletions go in small transactions so other
writers wait little. Eviction only loses time: an evicted program is compiled again.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from kdbkit.runtime.logging_setup import get_logger

_log = get_logger("runtime.cache_eviction")
USE_DDL = ("CREATE TABLE IF NOT EXISTS kdb_use (kernel_name TEXT NOT NULL, kernel_args TEXT NOT NULL, "
           "last_used INTEGER NOT NULL, PRIMARY KEY (kernel_name, kernel_args)) WITHOUT ROWID")
LOW_WATER = 0.8  # trimmed to this share of the limit
BATCH = 64  # entries deleted per transaction
BUSY_TIMEOUT_S = 5.0


def used_bytes(conn: sqlite3.Connection) -> int:
    """The bytes of the file's pages that hold data (free pages, reused by later writes, excluded)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


class Evictor:
    """The size keeper of one cache file.

    Args:
        path: the ``.ukdb`` file (opened with a connection of its own when first needed).
        max_bytes: the limit; 0 for none (uses are still noted, so a later limit has an order).
    """

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self._seen: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def used(self, kernel_name: str, kernel_args: str) -> None:
        """Note a hit (kept in memory until the next store)."""
        self._seen[(kernel_name, kernel_args)] = int(time.time())

    def stored(self, kernel_name: str, kernel_args: str) -> int:
        """After storing an entry: write the noted uses, then trim the file if it is over the
        limit, keeping that entry. Returns how many entries were evicted.

        Raises:
            sqlite3.Error: the caller treats it as any other failure to write the cache.
        """
        keep = (kernel_name, kernel_args)
        with self._lock:
            self._seen[keep] = int(time.time())
            seen, self._seen = self._seen, {}
            conn = self._connection()
            with conn:
                conn.executemany("INSERT OR REPLACE INTO kdb_use VALUES (?, ?, ?)",
                                 [(n, a, t) for (n, a), t in seen.items()])
            if not self.max_bytes or used_bytes(conn) <= self.max_bytes:
                return 0
            return self._trim(conn, keep)

    def _trim(self, conn: sqlite3.Connection, keep: tuple[str, str]) -> int:
        excess = used_bytes(conn) - int(self.max_bytes * LOW_WATER)
        victims, freed = [], 0
        # Oldest first; entries with no noted use (written by an older kdbkit, or never read
        # since) before any noted one.
        for name, args, size in conn.execute(
                "SELECT k.kernel_name, k.kernel_args, length(k.kernel_blob) FROM kern_db k LEFT JOIN kdb_use u "
                "ON u.kernel_name = k.kernel_name AND u.kernel_args = k.kernel_args "
                "ORDER BY coalesce(u.last_used, 0), k.id"):
            if freed >= excess:
                break
            if (name, args) != keep:
                victims.append((name, args))
                freed += size
        for start in range(0, len(victims), BATCH):
            batch = victims[start:start + BATCH]
            with conn:
                conn.executemany("DELETE FROM kern_db WHERE kernel_name = ? AND kernel_args = ?", batch)
                conn.executemany("DELETE FROM kdb_use WHERE kernel_name = ? AND kernel_args = ?", batch)
        _log.info("%s: evicted %d least recently used entr(ies), %d bytes, to stay under %d bytes", self.path,
                  len(victims), freed, self.max_bytes)
        return len(victims)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S,
                                   check_same_thread=False)
            try:
                conn.execute(USE_DDL)
                conn.commit()
            except sqlite3.Error:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def forget_file(self) -> None:
        """Drop the connection (the file was moved aside): the next store opens the new file."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def close(self) -> None:
        """Write the uses noted since the last store (best effort: they only order evictions)."""
        with self._lock:
            seen, self._seen = self._seen, {}
            try:
                if seen and self.path.is_file():
                    conn = self._connection()
                    with conn:
                        conn.executemany("INSERT OR REPLACE INTO kdb_use VALUES (?, ?, ?)",
                                         [(n, a, t) for (n, a), t in seen.items()])
            except sqlite3.Error as exc:
                _log.info("%s: last uses not written (%s)", self.path, exc)
            finally:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
