"""Open, read and write one bundle file (``.kdb`` or ``.ukdb``).

System bundles are opened read-only (``mode=ro``); user caches read-write, in WAL mode with
a busy timeout so that readers never wait for a writer. Opening costs O(1) in the file's
size: one read of ``kdb_meta`` and a probe of ``kern_db``; lookups use the unique index.
Every read proves the entry is the one asked for before returning its bytes: the row's own
``kernel_name`` and ``kernel_args`` (read from the table row, not from the index that found
it) must be the key, and ``kernel_hash`` is recomputed over the decoded bytes (over the key
and the bytes from format version 2 on). A mismatch raises
:class:`~kdb.errors.CorruptEntryError` naming the file and the key, and the bytes are
never returned. All SQL uses bound parameters.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from kdbkit.kdb import codec as _codec
from kdbkit.kdb import schema
from kdbkit.kdb.errors import (
    BundleBusyError,
    BundleError,
    BundleNotFoundError,
    BundleWriteError,
    CodecError,
    CorruptBundleError,
    CorruptEntryError,
    EmptyBundleError,
    KdbError,
    NotABundleError,
    ReadOnlyBundleError,
    UnsupportedFormatError,
)
from kdbkit.kdb.target import Target, parse_bundle_file_name
from kdbkit.kdb.version import __version__

PRODUCER = f"kdbkit {__version__}"
# What reading a damaged file can raise: SQLite's errors, and UnicodeDecodeError where a text
# value (a key, the schema, metadata) is no longer UTF-8; both become kdbkit errors here.
_SQLITE_READ_ERRORS = (sqlite3.Error, UnicodeDecodeError)
BUSY_TIMEOUT_S = 5.0


# The index finds the rowid; the row is then read by rowid, so that its name and args come from
# the table row itself (a plain WHERE on name and args lets SQLite read them from the index
# entry that matched, which a damaged index would make equal to the request). One statement,
# one text: SQLite's statement cache keys on it.
_GET_ENTRY = ("SELECT kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db "
              "WHERE rowid = (SELECT rowid FROM kern_db WHERE kernel_name = ? AND kernel_args = ?)")
# Every row as stored, from the table (never the index), in rowid order, a batch at a time.
_ROWS = ("SELECT rowid, kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db "
         "NOT INDEXED WHERE rowid > ? ORDER BY rowid LIMIT 256")
_FIRST_ROW = ("SELECT kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db "
              "NOT INDEXED ORDER BY rowid LIMIT 1")


@dataclass(frozen=True)
class BundleMetadata:
    """What a bundle says about itself (``kdb_meta``), or what a MIOpen file implies."""

    format_version: int
    target: Target | None
    compiler: str = ""
    binary_format: str = ""
    codec: str = "zstd"
    hash: str = "xxh3_128"
    producer: str = ""
    created: str = ""
    dictionary_size: int = 0
    reproducible: bool = False  # written by a reproducible build (kdb_meta.reproducible)
    # (kernel file, source digest) of every file the bundle was built from, sorted; empty for
    # bundles written before the manifest existed, user caches and MIOpen's files.
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def written_by_miopen(self) -> bool:
        return self.format_version == 0

    @property
    def source_digests(self) -> dict[str, str]:
        """The kernel-source manifest: file name -> digest of the source the bundle was built from."""
        return dict(self.sources)


@dataclass(frozen=True)
class EntryInfo:
    """One row without its blob: what ``kdb db ls`` shows."""

    kernel_name: str
    kernel_args: str
    stored_size: int
    raw_size: int
    kernel_hash: str
    compressed: bool


@dataclass(frozen=True)
class BundleStats:
    entries: int
    raw_bytes: int
    stored_bytes: int
    dictionary_bytes: int
    file_bytes: int

    @property
    def ratio(self) -> float:
        """Raw over stored (dictionary included): 5.0 means five times smaller."""
        stored = self.stored_bytes + self.dictionary_bytes
        return self.raw_bytes / stored if stored else 1.0


def _connect(path: Path, writable: bool, create: bool, immutable: bool = False) -> sqlite3.Connection:
    base = Path(os.path.abspath(path)).as_uri()  # abspath, not resolve(): no syscall per path component
    if writable:
        uri = base + ("?mode=rwc" if create else "?mode=rw")
    else:
        # immutable: no file locks or change checks (half the open time); right for installed
        # bundles, which are only ever replaced whole by a rename, never edited in place.
        uri = base + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    # check_same_thread=False: a Bundle serialises its own use with a lock (below), and the
    # runtime shares one handle between threads.
    return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)


class Bundle:
    """One open bundle file. Use :func:`open_bundle` or :meth:`Bundle.create`.

    Thread-safe: one connection per bundle, guarded by a lock. Not shared across
    processes (each process opens its own; SQLite locks the file between them).
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, writable: bool, metadata: BundleMetadata,
                 dictionary: bytes | None):
        self.path = path
        self._conn = conn
        self.writable = writable
        self.metadata = metadata
        self._lock = threading.RLock()
        self._reader = _codec.Codec(metadata.codec, dictionary=dictionary)
        self.keyed = metadata.format_version >= schema.KEYED_HASH_VERSION
        self._hash = _codec.hasher(metadata.hash)
        self._keyed_hash = _codec.keyed_hasher(metadata.hash)
        self._writer: _codec.Codec | None = None
        self.write_level = _codec.CACHE_LEVEL

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, *, writable: bool = False, wal: bool = False, immutable: bool = False) -> "Bundle":
        """Open an existing bundle.

        Args:
            path: the ``.kdb``/``.ukdb`` file.
            writable: open read-write (user caches, builders); default read-only.
            wal: with ``writable``, switch the file to WAL so readers never wait on writers.
            immutable: read-only, promise the file will not change while open (installed
                system bundles): SQLite skips locking.

        Raises:
            BundleNotFoundError, NotABundleError, CorruptBundleError, UnsupportedFormatError.
        """
        path = Path(path)
        if not path.is_file():
            raise BundleNotFoundError(f"{path}: no such bundle file", "check the path")
        try:
            conn = _connect(path, writable, create=False, immutable=immutable and not writable)
        except _SQLITE_READ_ERRORS as exc:
            raise _db_error(path, exc) from exc
        try:
            metadata, dictionary = _read_metadata(conn, path)
            if writable:
                _prepare_writable(conn, path, wal)
                if metadata.format_version < schema.FORMAT_VERSION:
                    with _transaction(conn, path):
                        schema.migrate(conn, metadata.format_version)
                    metadata, dictionary = _read_metadata(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, conn, writable, metadata, dictionary)

    @classmethod
    def create(cls, path: str | Path, target: Target, *, compiler: str, binary_format: str,
               sources: dict[str, str] | None = None,
               codec: str = "zstd", dictionary: bytes | None = None, wal: bool = False,
               exist_ok: bool = False, created: str | None = None, reproducible: bool = False) -> "Bundle":
        """Create a new, empty bundle (or open ``path`` if ``exist_ok`` and it exists).

        Args:
            path: file to create; its folder must exist.
            target: what every binary in it is built for.
            compiler: compiler identity and version, e.g. ``nvrtc 13.0``.
            binary_format: ``cubin``, ``hsaco`` or ``ocl-binary``.
            codec: ``zstd`` (default) or ``bzip2`` (MIOpen-compatible files).
            dictionary: zstd dictionary used for every blob, or None.
            sources: the kernel-source manifest (file name -> digest) of what it is built from.
            wal: WAL mode (user caches); bundles meant to ship stay in rollback mode.
            created: the ``created`` field (UTC ISO-8601); None: the current time; ``""``: none.
            reproducible: mark it written by a reproducible build (``kdb_meta.reproducible``),
                whose entries a later reproducible build may keep.
        """
        path = Path(path)
        try:
            conn = _connect(path, writable=True, create=True)
        except _SQLITE_READ_ERRORS as exc:
            raise _db_error(path, exc) from exc
        try:
            _prepare_writable(conn, path, wal)
            with _transaction(conn, path):
                existing = schema.tables(conn)
                if "kern_db" in existing and not exist_ok:
                    raise BundleError(f"{path}: already a bundle", "remove it first or open it for writing")
                if "kern_db" not in existing and existing - {"kdb_meta"}:
                    raise NotABundleError(f"{path}: an SQLite file with other tables ({', '.join(sorted(existing))})",
                                          "it is not a kernel bundle: use another file name")
                if "kern_db" not in existing:
                    schema.create_tables(conn)
                    meta = {
                        "format_version": str(schema.FORMAT_VERSION), "backend": target.backend,
                        "arch": target.arch, "features": ":".join(target.features),
                        "cu": "" if target.cu is None else str(target.cu), "compiler": compiler,
                        "binary_format": binary_format, "codec": codec,
                        "hash": "md5" if codec == "bzip2" else _codec.DEFAULT_HASH, "producer": PRODUCER,
                    }
                    if created is None:
                        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
                    if created:
                        meta["created"] = created
                    if reproducible:
                        meta["reproducible"] = "1"
                    if sources:
                        meta["sources"] = json.dumps(dict(sorted(sources.items())), separators=(",", ":"))
                    rows = list(meta.items()) + ([("zstd_dict", dictionary)] if dictionary else [])
                    conn.executemany("INSERT INTO kdb_meta(key, value) VALUES (?, ?)", rows)
            metadata, dictionary = _read_metadata(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, conn, True, metadata, dictionary)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------

    def get(self, kernel_name: str, kernel_args: str) -> bytes | None:
        """The binary stored under (name, args), or None if there is no such entry.

        Raises:
            CorruptEntryError: the entry does not decode or its hash does not match.
            CorruptBundleError: SQLite reports the file damaged.
        """
        row = self._row_of(kernel_name, kernel_args)
        return None if row is None else self._decode(kernel_name, kernel_args, row[2], row[3], row[4])

    def _row_of(self, kernel_name: str, kernel_args: str) -> tuple | None:
        """The row the index gives the key, proven to be that key's (None: no such entry)."""
        try:
            with self._lock:
                row = self._query_one(_GET_ENTRY, (kernel_name, kernel_args))
        except CorruptBundleError as exc:
            if isinstance(exc.__cause__, UnicodeDecodeError):  # this row's text: the entry, not the file
                raise self._corrupt(kernel_name, kernel_args, "its row holds text that is not UTF-8") from exc
            raise
        if row is not None and (row[0] != kernel_name or row[1] != kernel_args):
            raise self._corrupt(kernel_name, kernel_args, f"the index leads to the row of {row[0]!r} [{row[1]!r}] "
                                                          "(a damaged index)")
        return row

    def warm_up(self) -> None:
        """Do the one-time work of a first lookup now: SQLite prepares the lookup statement
        (a lookup of a key no entry has) and this thread's decoder loads the bundle's
        dictionary. No entry is decoded: the first row may be a 450 KB cubin, whose decode
        and hash would be wasted whenever the first program looked up is another one.

        The runtime calls it when a handle is made, so that the first program's lookup, which
        a network's first result waits on, does not also pay for this set-up.
        """
        try:
            with self._lock:
                self._query_one(_GET_ENTRY, ("", ""))  # the statement get() runs, prepared and cached
            self._reader.warm_up()
        except KdbError:
            pass  # a damaged page is reported by the lookup that reads it

    def _decode(self, name: str, args: str, blob: bytes, expected_hash: str, size: int) -> bytes:
        """The entry's bytes under the key (``name``, ``args``), proven by its hash."""
        if not isinstance(blob, bytes):
            raise self._corrupt(name, args, f"kernel_blob is {type(blob).__name__}, not a blob")
        try:
            data = self._reader.decode(blob, size)
        except CodecError as exc:
            raise self._corrupt(name, args, exc.problem) from exc
        actual = self._keyed_hash(name, args, data) if self.keyed else self._hash(data)
        if actual != expected_hash and actual != str(expected_hash).lower():  # the common case skips str().lower()
            covered = "key and data" if self.keyed else "data"
            raise self._corrupt(name, args, f"{self.metadata.hash} of the {covered} does not match kernel_hash "
                                            "(possible database corruption, or another entry's row)")
        return data

    def _corrupt(self, name: str, args: str, problem: str) -> CorruptEntryError:
        # Made only on failure: the messages cost more than a whole hit's hash check.
        return CorruptEntryError(f"{self.path}: entry {name} [{args}] is corrupt: {problem}",
                                 f"check the file with `kdb db verify {self.path}`", path=str(self.path),
                                 kernel_name=name, kernel_args=args)

    def entries(self) -> Iterator[EntryInfo]:
        """Every entry's key and sizes, in key order, without reading blobs into Python."""
        with self._lock:
            rows = self._query_all(
                "SELECT kernel_name, kernel_args, length(kernel_blob), uncompressed_size, kernel_hash "
                "FROM kern_db ORDER BY kernel_name, kernel_args", ())
        for name, args, stored, size, h in rows:
            yield EntryInfo(name, args, stored, size or stored, h, size != 0)

    def items(self) -> Iterator[tuple[str, str, bytes]]:
        """Every (name, args, decoded bytes) in the order stored, each checked under its row's own
        key; batches of rows, not all at once.

        Raises:
            CorruptEntryError: at the first entry that fails its check.
        """
        for _, name, args, blob, h, size in self._rows():
            yield name, args, self._decode_row(name, args, blob, h, size)

    def first_entry(self) -> tuple[str, str, bytes] | None:
        """(name, args, decoded bytes) of the row stored first, checked under its key; None when
        the bundle is empty. One row read, where ``items`` reads a batch: for a look at what a
        bundle's binaries are (a code object's version, say) without reading the others.

        Raises:
            CorruptEntryError: the entry fails its check.
        """
        with self._lock:
            row = self._query_one(_FIRST_ROW, ())
        return None if row is None else (row[0], row[1], self._decode_row(*row))

    def checked_rows(self) -> Iterator[tuple[int, str, str, CorruptEntryError | None]]:
        """(rowid, name, args, the entry's problem or None) for every table row: its bytes checked
        under its own key, and the index checked to lead to this very row for that key. What
        ``kdb db verify`` reports; one damaged row never stops the others being checked."""
        for rowid, name, args, blob, h, size in self._rows():
            try:
                self._decode_row(name, args, blob, h, size)
                found = self._query_one("SELECT rowid FROM kern_db WHERE kernel_name = ? AND kernel_args = ?",
                                        (name, args))
                if found is None or found[0] != rowid:
                    raise self._corrupt(name, args, f"the index leads its key to {'no row' if found is None else f'row {found[0]}'}"
                                                    f", not to row {rowid} (a damaged index or a duplicated key)")
            except CorruptEntryError as exc:
                yield rowid, str(name), str(args), exc
            else:
                yield rowid, name, args, None

    def duplicate_keys(self) -> list[tuple[str, str, str]]:
        """(name, args, comma-joined rowids) of every key that more than one table row holds."""
        with self._lock:
            return self._query_all(
                "SELECT kernel_name, kernel_args, group_concat(rowid) FROM kern_db NOT INDEXED "
                "GROUP BY kernel_name, kernel_args HAVING count(*) > 1", ())

    def _decode_row(self, name, args, blob, h, size) -> bytes:
        """A table row's bytes, checked under the row's own key (which may be garbage)."""
        if not (isinstance(name, str) and isinstance(args, str)):
            raise self._corrupt(str(name), str(args), "its key is not text")
        return self._decode(name, args, blob, h, size)

    def _rows(self) -> Iterator[tuple]:
        """Every row as stored in the table (rowid first), read 256 at a time.

        Raises:
            CorruptBundleError: the table gives rowids out of order (a damaged b-tree), which
                would otherwise make this loop go round the same rows for ever.
        """
        last = -(1 << 63)
        while True:
            with self._lock:
                rows = self._query_all(_ROWS, (last,))
            if not rows:
                return
            for row in rows:
                if not (isinstance(row[0], int) and row[0] > last):
                    raise CorruptBundleError(f"{self.path}: the table gives row {row[0]!r} after row {last} "
                                             "(the file is damaged)", f"check it with `kdb db verify {self.path}`")
                last = row[0]
                yield row

    def count(self) -> int:
        with self._lock:
            return self._query_one("SELECT count(*) FROM kern_db", ())[0]

    def stats(self) -> BundleStats:
        with self._lock:
            n, raw, stored = self._query_one(
                "SELECT count(*), coalesce(sum(CASE WHEN uncompressed_size = 0 THEN length(kernel_blob) "
                "ELSE uncompressed_size END), 0), coalesce(sum(length(kernel_blob)), 0) FROM kern_db", ())
        return BundleStats(n, raw, stored, self.metadata.dictionary_size, self.path.stat().st_size)

    def integrity_check(self) -> list[str]:
        """SQLite's ``PRAGMA integrity_check``: empty when the file is sound, else its messages."""
        with self._lock:
            rows = self._query_all("PRAGMA integrity_check", ())
        msgs = [r[0] for r in rows]
        return [] if msgs == ["ok"] else msgs

    # -- writing -------------------------------------------------------------------------

    def put(self, kernel_name: str, kernel_args: str, binary: bytes) -> None:
        """Store one binary (replacing an entry with the same key)."""
        self.put_many([(kernel_name, kernel_args, binary)])

    def put_many(self, entries: Iterable[tuple[str, str, bytes]]) -> int:
        """Store a batch of (name, args, binary) in one transaction; returns how many.

        Compression happens before the transaction opens, so the write lock is held only
        for the inserts.
        """
        if not self.writable:
            raise ReadOnlyBundleError(f"{self.path}: opened read-only", "open it with writable=True to add entries")
        codec = self._codec_for_writing()
        digest = self._keyed_hash if self.keyed else (lambda name, args, binary: self._hash(binary))
        rows = []
        for name, args, binary in entries:
            enc = codec.encode(binary)
            rows.append((name, args, enc.blob, digest(name, args, binary), enc.uncompressed_size))
        with self._lock, _transaction(self._conn, self.path):
            self._conn.executemany(
                "INSERT OR REPLACE INTO kern_db(kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
                "VALUES (?, ?, ?, ?, ?)", rows)
        return len(rows)

    def put_stored(self, entries: Iterable[tuple[str, str, "_codec.StoredBlob"]]) -> int:
        """Store a batch of entries already encoded by :func:`kdbkit.kdb.codec.encode_for_bundle`,
        in one transaction; returns how many.

        Raises:
            BundleError: this bundle's codec, dictionary, hash or format is not what those entries
                assume, or an entry was encoded for another key than the one it is stored under.
        """
        if not self.writable:
            raise ReadOnlyBundleError(f"{self.path}: opened read-only", "open it with writable=True to add entries")
        if not self._takes_stored():
            raise BundleError(f"{self.path}: pre-encoded entries need a zstd bundle of format {schema.FORMAT_VERSION} "
                              f"with no dictionary and {_codec.DEFAULT_HASH} hashes",
                              "write the binaries with put_many instead")
        rows = []
        for name, args, e in entries:
            if (e.kernel_name, e.kernel_args) != (name, args):
                raise BundleError(f"{self.path}: an entry encoded for {e.kernel_name} [{e.kernel_args}] was to be "
                                  f"stored under {name} [{args}]", "encode each binary for the key it is stored under")
            rows.append((name, args, e.blob, e.kernel_hash, e.uncompressed_size))
        with self._lock, _transaction(self._conn, self.path):
            self._conn.executemany(
                "INSERT OR REPLACE INTO kern_db(kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
                "VALUES (?, ?, ?, ?, ?)", rows)
        return len(rows)

    def stored_items(self) -> Iterator[tuple[str, str, "_codec.StoredBlob"]]:
        """Every entry as stored, each checked by decoding it first (a damaged one raises
        CorruptEntryError), in the form :meth:`put_stored` takes: zstd bundles with no dictionary
        and the default hash give their stored bytes, others their data encoded again."""
        as_stored = self._takes_stored()
        for _, name, args, blob, h, size in self._rows():
            yield name, args, self._stored(name, args, blob, h, size, self._decode_row(name, args, blob, h, size),
                                           as_stored)

    def stored_item(self, kernel_name: str, kernel_args: str) -> "_codec.StoredBlob | None":
        """One entry as :meth:`stored_items` gives it, looked up by its key (None: no such entry).

        Raises:
            CorruptEntryError: the entry does not decode, its hash does not match, or the index
                leads its key to another row.
        """
        row = self._row_of(kernel_name, kernel_args)
        if row is None:
            return None
        data = self._decode(kernel_name, kernel_args, row[2], row[3], row[4])
        return self._stored(kernel_name, kernel_args, row[2], row[3], row[4], data, self._takes_stored())

    @staticmethod
    def _stored(name: str, args: str, blob, h, size, data: bytes, as_stored: bool) -> "_codec.StoredBlob":
        """A checked entry in :meth:`put_stored`'s form: its row as it is, or ``data`` encoded again."""
        return (_codec.StoredBlob(name, args, bytes(blob), size, str(h).lower()) if as_stored
                else _codec.encode_for_bundle(name, args, data))

    def _takes_stored(self) -> bool:
        """Whether this bundle stores entries exactly as :func:`encode_for_bundle` makes them."""
        md = self.metadata
        return (md.codec == "zstd" and self._reader.dictionary is None and md.hash == _codec.DEFAULT_HASH
                and self.keyed)

    def delete(self, kernel_name: str, kernel_args: str) -> bool:
        """Remove one entry (a corrupt one, say); True if it existed."""
        if not self.writable:
            raise ReadOnlyBundleError(f"{self.path}: opened read-only, so entries cannot be deleted",
                                      "open it with writable=True")
        with self._lock, _transaction(self._conn, self.path):
            cur = self._conn.execute("DELETE FROM kern_db WHERE kernel_name = ? AND kernel_args = ?",
                                     (kernel_name, kernel_args))
        return cur.rowcount > 0

    def delete_all(self) -> int:
        """Remove every entry in one transaction (metadata stays); returns how many.

        Safe while other processes use the file: they see the entries until their next read.
        """
        if not self.writable:
            raise ReadOnlyBundleError(f"{self.path}: opened read-only, so entries cannot be deleted",
                                      "open it with writable=True")
        with self._lock, _transaction(self._conn, self.path):
            return self._conn.execute("DELETE FROM kern_db").rowcount

    def compact(self, page_size: int | None = None) -> None:
        """VACUUM: drop free pages, so a shipped file holds nothing but its entries.

        Args:
            page_size: rebuild the file with this page size (a power of two, 512-65536).
        """
        if not self.writable:
            raise ReadOnlyBundleError(f"{self.path}: opened read-only, so it cannot be compacted",
                                      "open it with writable=True")
        with self._lock:
            try:
                if page_size is not None:
                    self._conn.execute(f"PRAGMA page_size = {int(page_size)}")
                self._conn.execute("VACUUM")
            except _SQLITE_READ_ERRORS as exc:
                raise _db_error(self.path, exc) from exc

    def _codec_for_writing(self) -> _codec.Codec:
        if self._writer is None or self._writer.level != self.write_level:
            self._writer = _codec.Codec(self.metadata.codec, level=self.write_level, dictionary=self._reader.dictionary)
        return self._writer

    # -- SQLite errors become kdbkit errors that name the file -----------------------------

    def _query_one(self, sql: str, params: tuple):
        try:
            cur = self._conn.execute(sql, params)
            try:
                return cur.fetchone()
            finally:
                # Reset the statement now: a half-stepped SELECT keeps its read transaction,
                # and in WAL mode that pins an old snapshot, so this connection would not see
                # an entry another process (or thread) has stored since: a re-check after
                # taking the compile lock would miss, and the program be compiled twice.
                cur.close()
        except _SQLITE_READ_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def _query_all(self, sql: str, params: tuple):
        try:
            return self._conn.execute(sql, params).fetchall()
        except _SQLITE_READ_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, writable={self.writable})"


def open_bundle(path: str | Path, *, writable: bool = False, wal: bool = False, immutable: bool = False) -> Bundle:
    """Open an existing bundle; see :meth:`Bundle.open`."""
    return Bundle.open(path, writable=writable, wal=wal, immutable=immutable)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error; SQLite errors name the file."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self.conn, self.path = conn, path

    def __enter__(self):
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except _SQLITE_READ_ERRORS as exc:
            raise _db_error(self.path, exc) from exc

    def __exit__(self, exc_type, exc, tb):
        try:
            self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.Error as err:
            if exc_type is None:
                raise _db_error(self.path, err) from err
        if isinstance(exc, _SQLITE_READ_ERRORS):  # a failed write inside the block: name the file
            raise _db_error(self.path, exc) from exc
        return False


def _db_error(path: Path, exc: sqlite3.Error | UnicodeDecodeError) -> KdbError:
    """The kdbkit error for an SQLite failure, chosen by SQLite's (primary) error code.

    The text of SQLite's messages differs between versions and locales; its codes do not.
    An error without a code (raised by Python's sqlite3 module itself) is a plain BundleError.
    Text that does not decode (a damaged key, schema or metadata value) is a damaged file.
    """
    if isinstance(exc, UnicodeDecodeError):
        return CorruptBundleError(f"{path}: the file is damaged (text that is not UTF-8: {exc.reason})",
                                  f"check it with `kdb db verify {path}`, then rebuild or reinstall it")
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    detail = f"{exc}" + (f", {exc.sqlite_errorname}" if getattr(exc, "sqlite_errorname", None) else "")
    if primary == sqlite3.SQLITE_NOTADB:
        return NotABundleError(f"{path}: not a bundle (not an SQLite file)", "check the path")
    if primary == sqlite3.SQLITE_CORRUPT:
        return CorruptBundleError(f"{path}: the file is damaged ({detail})",
                                  f"check it with `kdb db verify {path}`, then rebuild or reinstall it")
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return BundleBusyError(f"{path}: database is locked by another process ({detail})",
                               "retry; if it persists, look for a process stuck writing it")
    if primary == sqlite3.SQLITE_FULL:
        return BundleWriteError(f"{path}: the disk is full ({detail})",
                                "free space, or point KDB_CUSTOM_CACHE_DIR at another disk")
    if primary in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN):
        return BundleWriteError(f"{path}: cannot open or write the file ({detail})",
                                "check that the file and its folder exist and are writable")
    if primary == sqlite3.SQLITE_IOERR:
        return BundleWriteError(f"{path}: disk I/O error ({detail})",
                                "network file systems break SQLite's locking: keep the file on a local disk")
    return BundleError(f"{path}: SQLite error ({detail})", f"check the file with `kdb db verify {path}`")


def _prepare_writable(conn: sqlite3.Connection, path: Path, wal: bool) -> None:
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        mode = "wal" if wal else "delete"
        # Switching the journal mode takes an exclusive lock: only ask when it must change,
        # so that processes opening an existing WAL cache at once do not contend for it.
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != mode:
            conn.execute(f"PRAGMA journal_mode = {mode}")
        # NORMAL is durable in WAL mode across application crashes, which is what a cache needs.
        conn.execute("PRAGMA synchronous = NORMAL")
    except _SQLITE_READ_ERRORS as exc:
        raise _db_error(path, exc) from exc


def _read_metadata(conn: sqlite3.Connection, path: Path) -> tuple[BundleMetadata, bytes | None]:
    """Read ``kdb_meta`` (O(1)), or infer a MIOpen file's metadata from its name."""
    try:
        names = schema.tables(conn)
    except _SQLITE_READ_ERRORS as exc:
        raise _db_error(path, exc) from exc
    if not names:  # SQLite makes the file before its creator's first transaction commits
        raise EmptyBundleError(f"{path}: an SQLite file with no tables yet (being created, or empty)",
                               "wait for the process creating it, or remove it if there is none")
    if "kern_db" not in names:
        raise NotABundleError(f"{path}: SQLite file without a kern_db table, so not a kernel bundle", "check the path")
    if "kdb_meta" not in names:
        return BundleMetadata(0, _target_from_name(path), codec="bzip2", hash="md5", producer="MIOpen"), None
    try:
        meta = dict(conn.execute("SELECT key, value FROM kdb_meta").fetchall())
    except _SQLITE_READ_ERRORS as exc:
        raise _db_error(path, exc) from exc
    version = _format_version(meta, path)
    codec, hash_alg = meta.get("codec", "bzip2"), meta.get("hash", "md5")
    if not (isinstance(codec, str) and isinstance(hash_alg, str)
            and codec in _codec.CODECS and hash_alg in _codec.HASHES):
        raise _bad_meta(path, f"unknown codec {codec!r} or hash {hash_alg!r} in kdb_meta")
    dictionary = meta.get("zstd_dict")
    if dictionary is not None and not isinstance(dictionary, bytes):
        raise _bad_meta(path, "kdb_meta.zstd_dict is not a blob")
    target = _meta_target(meta, path)
    manifest = _meta_sources(meta, path)
    md = BundleMetadata(
        format_version=version, target=target, compiler=str(meta.get("compiler", "")),
        binary_format=str(meta.get("binary_format", "")), codec=codec, hash=hash_alg,
        producer=str(meta.get("producer", "")), created=str(meta.get("created", "")),
        dictionary_size=len(dictionary) if dictionary else 0, sources=tuple(sorted(manifest.items())),
        reproducible=meta.get("reproducible") == "1")
    return md, dictionary


# The largest number a metadata field may hold (format version, CU count): anything longer is
# damage, refused before Python turns thousands of digits into an integer.
_MAX_META_DIGITS = 18


def _bad_meta(path: Path, problem: str) -> CorruptBundleError:
    return CorruptBundleError(f"{path}: {problem}", "rebuild or reinstall the bundle")


def _meta_int(value: object) -> int | None:
    """A non-negative integer stored as text or as an integer, or None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value < 10 ** _MAX_META_DIGITS else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _MAX_META_DIGITS:
        return int(value)
    return None


def _format_version(meta: dict, path: Path) -> int:
    """``kdb_meta.format_version``: a known version, else a kdbkit error (never a crash later,
    in a migration that does not exist)."""
    raw = meta.get("format_version", "0")
    version = _meta_int(raw)
    if version is None:
        raise _bad_meta(path, f"kdb_meta.format_version is {str(raw)[:40]!r}, not a number")
    if version > schema.FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{path}: bundle format version {version} is newer than this kdbkit reads ({schema.FORMAT_VERSION})",
            "upgrade kdbkit (pip install -U kdbkit) or rebuild the bundle with this version")
    return version


def _meta_target(meta: dict, path: Path) -> Target | None:
    """The target ``kdb_meta`` names, None when it names no arch."""
    if not meta.get("arch"):
        return None
    try:
        if not all(isinstance(meta.get(k, ""), str) for k in ("backend", "arch", "features", "cu")):
            raise ValueError("a field is not text")
        cu = _meta_int(meta["cu"]) if meta.get("cu") else None
        if meta.get("cu") and cu is None:
            raise ValueError(f"cu {meta['cu'][:40]!r} is not a count")
        features = tuple(f for f in meta.get("features", "").split(":") if f)
        return Target(meta.get("backend", ""), meta["arch"], features, cu)
    except (KdbError, ValueError, TypeError) as exc:
        raise _bad_meta(path, f"kdb_meta describes no valid target ({exc})") from None


def _meta_sources(meta: dict, path: Path) -> dict[str, str]:
    """The kernel-source manifest, empty when there is none."""
    raw = meta.get("sources")
    if not raw:
        return {}
    try:
        if not isinstance(raw, str):
            raise ValueError(f"it is {type(raw).__name__}, not text")
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or not all(isinstance(v, str) for v in manifest.values()):
            raise ValueError("not a mapping of file names to digests")
    except (ValueError, RecursionError) as exc:
        raise _bad_meta(path, f"kdb_meta.sources is not a kernel-source manifest ({exc})") from None
    return manifest


def _target_from_name(path: Path) -> Target | None:
    try:
        name = parse_bundle_file_name(path)
        return Target(name.backend, name.arch, (), name.cu)
    except KdbError:
        return None
