"""The SQLite layout of a bundle, its format version and its migrations.

Format version 2 (this file writes it) has the tables of version 1; what changes is
``kernel_hash``: it is *keyed*, the digest of the entry's key and then its bytes
(:func:`kdbkit.kdb.codec.keyed_digest`), so an entry is bound to its key and a row moved,
swapped or reached under another key fails its check. Version 1's hashes covered the bytes
alone; such files are still read (each row's own name and args are checked against the key
asked for) and are upgraded when opened for writing.

Format version 1::

    kern_db(id INTEGER PRIMARY KEY, kernel_name TEXT NOT NULL, kernel_args TEXT NOT NULL,
            kernel_blob BLOB NOT NULL, kernel_hash TEXT NOT NULL, uncompressed_size INT NOT NULL)
    UNIQUE INDEX idx_kern_db ON kern_db(kernel_name, kernel_args)      -- MIOpen's, unchanged
    kdb_meta(key TEXT PRIMARY KEY, value)                              -- kdbkit's addition

``kdb_meta`` keys (all TEXT but ``zstd_dict``, a BLOB):
``format_version``, ``backend``, ``arch``, ``features`` (colon-joined), ``cu`` (empty for
an arch-wide bundle), ``compiler`` (identity and version, e.g. ``nvrtc 13.0``),
``binary_format`` (``cubin``, ``hsaco``, ``ocl-binary``), ``codec`` (``zstd``/``bzip2``),
``hash`` (``xxh3_128``/``sha256``/``md5``), ``zstd_dict`` (optional), ``producer`` (``kdbkit 0.1.0``),
``created`` (UTC ISO-8601; ``SOURCE_DATE_EPOCH``'s time where that is set, absent from a
reproducible build without it: :mod:`kdbkit.kdb.reproducible`), ``sources`` (optional: JSON object
of kernel file name -> source digest, the manifest of what the bundle was built from; a handle
digests just these up front), ``reproducible`` (optional, ``1``: written by a reproducible build;
added within format 2, which readers that do not know it ignore).

Version 0 is a file written by MIOpen: ``kern_db`` alone, bzip2 blobs, MD5 hashes; it is
read as is and given a ``kdb_meta`` table if it is ever opened for writing.
"""

from __future__ import annotations

import sqlite3

from kdbkit.kdb import codec as _codec

FORMAT_VERSION = 2
# The first version whose kernel_hash covers the key (see the module's docstring).
KEYED_HASH_VERSION = 2

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
    "codec", "hash", "zstd_dict", "producer", "created", "sources", "reproducible",
)


def create_tables(conn: sqlite3.Connection) -> None:
    """Create ``kern_db``, its index and ``kdb_meta`` inside the caller's transaction.

    (``executescript`` would commit the caller's transaction first, so statements go one by one.)
    """
    for statement in (KERN_DB_DDL + META_DDL).split(";"):
        if statement.strip():
            conn.execute(statement)


def tables(conn: sqlite3.Connection) -> set[str]:
    # str(): in a damaged file a name may come back as a blob or a number, and the set is sorted
    # into messages.
    return {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    """A MIOpen file gains kdb_meta describing what it already holds (bzip2, md5)."""
    conn.execute(META_DDL)
    conn.executemany(
        "INSERT OR IGNORE INTO kdb_meta(key, value) VALUES (?, ?)",
        [("codec", "bzip2"), ("hash", "md5"), ("producer", "MIOpen")],
    )


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Every entry whose plain hash checks gets its keyed hash; one that does not check keeps
    its old hash, which fails the keyed check, so it stays a corrupt entry (never served)."""
    meta = dict(conn.execute("SELECT key, value FROM kdb_meta").fetchall())
    algorithm = meta.get("hash", "md5")
    reader = _codec.Codec(meta.get("codec", "bzip2"), dictionary=meta.get("zstd_dict") or None)
    plain, keyed = _codec.hasher(algorithm), _codec.keyed_hasher(algorithm)
    last = -(1 << 63)
    while rows := conn.execute(
            "SELECT rowid, kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db "
            "NOT INDEXED WHERE rowid > ? ORDER BY rowid LIMIT 256", (last,)).fetchall():
        updates = [(keyed(name, args, data), rowid) for rowid, name, args, blob, h, size in rows
                   if (data := _checked_plain(reader, plain, name, args, blob, h, size)) is not None]
        conn.executemany("UPDATE kern_db SET kernel_hash = ? WHERE rowid = ?", updates)
        last = rows[-1][0]


def _checked_plain(reader, plain, name, args, blob, expected, size) -> bytes | None:
    """A version-1 entry's bytes if they decode and match its plain hash, else None."""
    if not (isinstance(name, str) and isinstance(args, str) and isinstance(blob, bytes)):
        return None
    try:
        data = reader.decode(blob, size)
    except _codec.CodecError:
        return None
    return data if plain(data) == str(expected).lower() else None


# MIGRATIONS[v] upgrades a file of version v to v + 1 in place (inside one transaction).
MIGRATIONS = {0: _migrate_0_to_1, 1: _migrate_1_to_2}


def migrate(conn: sqlite3.Connection, from_version: int) -> None:
    """Bring a writable file from ``from_version`` up to :data:`FORMAT_VERSION`."""
    for v in range(from_version, FORMAT_VERSION):
        MIGRATIONS[v](conn)
    conn.execute(
        "INSERT OR REPLACE INTO kdb_meta(key, value) VALUES ('format_version', ?)", (str(FORMAT_VERSION),)
    )
