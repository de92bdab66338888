"""The SQLite layout of a bundle, its format version and its migrations.

Format version 1 (this file writes it)::

    kern_db(id INTEGER PRIMARY KEY, kernel_name TEXT NOT NULL, kernel_args TEXT NOT NULL,
            kernel_blob BLOB NOT NULL, kernel_hash TEXT NOT NULL, uncompressed_size INT NOT NULL)
    UNIQUE INDEX idx_kern_db ON kern_db(kernel_name, kernel_args)      -- MIOpen's, unchanged
    kdb_meta(key TEXT PRIMARY KEY, value)                              -- kdbkit's addition

``kdb_meta`` keys (all TEXT but ``zstd_dict``, a BLOB):
``format_version``, ``backend``, ``arch``, ``features`` (colon-joined), ``cu`` (empty for
an arch-wide bundle), ``compiler`` (identity and version, e.g. ``nvrtc 13.0``),
``binary_format`` (``cubin``, ``hsaco``, ``ocl-binary``), ``codec`` (``zstd``/``bzip2``),
``hash`` (``xxh3_128``/``sha256``/``md5``), ``zstd_dict`` (optional), ``producer`` (``kdbkit 0.1.0``),
``created`` (UTC ISO-8601), ``sources`` (optional: JSON object of kernel file name -> source
digest, the manifest of what the bundle was built from; a handle digests just these up front).

Version 0 is a file written by MIOpen: ``kern_db`` alone, bzip2 blobs, MD5 hashes; it is
read as is and given a ``kdb_meta`` table if it is ever opened for writing.
"""

from __future__ import annotations

import sqlite3

FORMAT_VERSION = 1

KERN_DB_COLUMNS = ("id", "kernel_name", "kernel_args", "kernel_blob", "kernel_hash", "uncompressed_size")

KERN_DB_DDL = """
CREATE TABLE IF NOT EXISTS kern_db (
    id INTEGER PRIMARY KEY,
    kernel_name TEXT NOT NULL,
    kernel_args TEXT NOT NULL,
    kernel_blob BLOB NOT NULL,
    kernel_hash TEXT NOT NULL,
    uncompressed_size INT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_kern_db ON kern_db(kernel_name, kernel_args);
"""

META_DDL = "CREATE TABLE IF NOT EXISTS kdb_meta (key TEXT PRIMARY KEY, value);"

META_KEYS = (
    "format_version", "backend", "arch", "features", "cu", "compiler", "binary_format",
    "codec", "hash", "zstd_dict", "producer", "created", "sources",
)


def create_tables(conn: sqlite3.Connection) -> None:
    """Create ``kern_db``, its index and ``kdb_meta`` inside the caller's transaction.

    (``executescript`` would commit the caller's transaction first, so statements go one by one.)
    """
    for statement in (KERN_DB_DDL + META_DDL).split(";"):
        if statement.strip():
            conn.execute(statement)


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    """A MIOpen file gains kdb_meta describing what it already holds (bzip2, md5)."""
    conn.execute(META_DDL)
    conn.executemany(
        "INSERT OR IGNORE INTO kdb_meta(key, value) VALUES (?, ?)",
        [("codec", "bzip2"), ("hash", "md5"), ("producer", "MIOpen")],
    )


# MIGRATIONS[v] upgrades a file of version v to v + 1 in place (inside one transaction).
MIGRATIONS = {0: _migrate_0_to_1}


def migrate(conn: sqlite3.Connection, from_version: int) -> None:
    """Bring a writable file from ``from_version`` up to :data:`FORMAT_VERSION`."""
    for v in range(from_version, FORMAT_VERSION):
        MIGRATIONS[v](conn)
    conn.execute(
        "INSERT OR REPLACE INTO kdb_meta(key, value) VALUES ('format_version', ?)", (str(FORMAT_VERSION),)
    )
