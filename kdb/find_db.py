"""The find-db: each problem's solvers ranked by a find step, in SQLite, per exact target.

Two kinds of file, as MIOpen's two-file db: a system find-db shipped beside the bundles
(``<target>.fdb``, read-only) and the user find-db (``<target>.ufdb``, WAL, written by find).
Reads take the user file's record for a config when it has one, else the system file's
(:meth:`FindDb.load_user` and :meth:`FindDb.load_system` read each kind apart, for a caller
that asks a cluster's shared rankings in between); writes go to the user file only. A config's
ranking is replaced whole, in one transaction, so a reader in another process sees the old
ranking or the new one, never a mix.

Schema, version 1 (``find_meta`` holds ``schema``, ``target`` and ``producer``)::

    find_db(config TEXT, solver_id INTEGER, solver TEXT, rank INTEGER, time_ms REAL,
            workspace INTEGER, PRIMARY KEY (config, solver_id))

Storage errors never reach the caller as crashes: a damaged user file is moved aside and a new
one started, an unreadable system file is skipped, each with one warning.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from contextlib import closing
from typing import Callable, Sequence

from kdbkit.kdb.private_files import make_file_private, make_private_folders

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
SYSTEM_SUFFIX = ".fdb"
USER_SUFFIX = ".ufdb"
USER_RECHECK_S = 0.5  # how long a missing user file is believed missing before looking again

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS find_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS find_db (config TEXT NOT NULL, solver_id INTEGER NOT NULL, solver TEXT NOT NULL, "
    "rank INTEGER NOT NULL, time_ms REAL NOT NULL, workspace INTEGER NOT NULL, PRIMARY KEY (config, solver_id))",
)


@dataclass(frozen=True)
class FindRecord:
    """One solver's place in a problem's ranking."""

    solver_id: int
    solver: str
    rank: int
    time_ms: float
    workspace: int


Warn = Callable[[str, str], None]  # (once-key, message)


def _connect(path: Path, writable: bool) -> sqlite3.Connection:
    mode = "rwc" if writable else "ro"
    conn = sqlite3.connect(f"{Path(os.path.abspath(path)).as_uri()}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_S,
                           isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


class _DamagedRow(ValueError):
    """A find_db row whose values are not of their columns' types (a damaged file)."""


# What reading a damaged find-db can raise: SQLite's errors, text that is not UTF-8 (a
# ValueError), and rows of the wrong types.
_READ_ERRORS = (sqlite3.Error, ValueError)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _record(solver_id, solver, rank, time_ms, workspace) -> FindRecord:
    if not (_is_int(solver_id) and isinstance(solver, str) and _is_int(rank) and _is_int(workspace)
            and isinstance(time_ms, (int, float))):
        raise _DamagedRow(f"a find_db row holds ({solver_id!r:.40}, {solver!r:.40}, {rank!r:.40}, {time_ms!r:.40}, "
                          f"{workspace!r:.40}), not (solver id, solver, rank, time, workspace)")
    return FindRecord(solver_id, solver, rank, float(time_ms), workspace)


def _records(conn: sqlite3.Connection, config: str) -> list[FindRecord] | None:
    rows = conn.execute("SELECT solver_id, solver, rank, time_ms, workspace FROM find_db WHERE config = ? "
                        "ORDER BY rank", (config,)).fetchall()
    return [_record(*row) for row in rows] or None


def system_file_name(target) -> str:
    """``sm_90_132.fdb``: the system find-db of a :class:`~kdbkit.kdb.target.Target`, named for
    the exact device as its bundle is (rankings depend on the device)."""
    return Path(target.bundle_name()).stem + SYSTEM_SUFFIX


def configs_in(path: str | Path) -> list[str]:
    """The config strings of every problem a find-db file (system or user) ranks, sorted: what a
    build takes as its catalogue (``kdb build --catalogue sm_90_132.ufdb``).

    Raises:
        NotABundleError: the file is not a find-db (not SQLite, or no ``find_db`` table).
    """
    from kdbkit.kdb.errors import NotABundleError

    try:
        with closing(_connect(Path(path), writable=False)) as conn:
            configs = [row[0] for row in conn.execute("SELECT DISTINCT config FROM find_db ORDER BY config")]
        if not all(isinstance(c, str) for c in configs):
            raise _DamagedRow("a config is not text")
        return configs
    except _READ_ERRORS as exc:
        raise NotABundleError(f"{path} is not a find-db ({exc})",
                              "give a .fdb or .ufdb file that find wrote, or a text catalogue") from None


def read_rankings(path: str | Path) -> dict[str, list[FindRecord]]:
    """Every ranking a find-db file holds, by config string.

    Raises:
        NotABundleError: the file is not a find-db.
    """
    from kdbkit.kdb.errors import NotABundleError

    rankings: dict[str, list[FindRecord]] = {}
    try:
        with closing(_connect(Path(path), writable=False)) as conn:
            for config, *row in conn.execute("SELECT config, solver_id, solver, rank, time_ms, workspace "
                                             "FROM find_db ORDER BY config, rank"):
                if not isinstance(config, str):
                    raise _DamagedRow(f"config {config!r:.40} is not text")
                rankings.setdefault(config, []).append(_record(*row))
    except _READ_ERRORS as exc:
        raise NotABundleError(f"{path} is not a find-db ({exc})", "give a .fdb or .ufdb file that find wrote") from None
    return rankings


def write_system_find_db(path: str | Path, target_name: str, rankings: dict[str, Sequence[FindRecord]], *,
                         producer: str) -> Path:
    """Write a system find-db (``<target>.fdb``: rollback journal, meant to ship read-only)
    holding ``rankings``, atomically: a reader sees the old file or the new one.

    Raises:
        BundleWriteError: the folder cannot be written.
    """
    from kdbkit.kdb.errors import BundleWriteError

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with closing(_connect(tmp, writable=True)) as conn:
            conn.execute("PRAGMA journal_mode = delete")
            conn.execute("BEGIN")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.executemany("INSERT INTO find_meta VALUES (?, ?)",
                             [("schema", str(SCHEMA_VERSION)), ("target", target_name), ("producer", producer)])
            conn.executemany("INSERT INTO find_db VALUES (?, ?, ?, ?, ?, ?)",
                             [(config, r.solver_id, r.solver, r.rank, r.time_ms, r.workspace)
                              for config, records in sorted(rankings.items()) for r in records])
            conn.execute("COMMIT")
        os.replace(tmp, path)
    except (OSError, sqlite3.Error) as exc:
        raise BundleWriteError(f"cannot write find-db {path}: {exc}", "check the folder exists and is writable") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


class FindDb:
    """A target's system find-db files and its user find-db file (thread-safe)."""

    def __init__(self, target_name: str, system_dirs: Sequence[Path], user_dir: Path | None, *,
                 producer: str, warn: Warn):
        """
        Args:
            target_name: the exact target, e.g. ``sm_90_132``: rankings depend on the device.
            system_dirs: folders searched for ``<target>.fdb``, first first.
            user_dir: folder of ``<target>.ufdb``; ``None`` disables writing and reading it.
            producer: written into a new user file's metadata (kdbkit's version).
            warn: called with (once-key, message) for each storage problem.
        """
        self.system_paths = [Path(d) / f"{target_name}{SYSTEM_SUFFIX}" for d in system_dirs]
        self.user_path = Path(user_dir) / f"{target_name}{USER_SUFFIX}" if user_dir is not None else None
        self._user_path_str = str(self.user_path)
        self._user_absent_until = 0.0  # time.monotonic() until which the user file is taken to be absent
        self._target, self._producer, self._warn = target_name, producer, warn
        self._lock = threading.Lock()
        self._user: sqlite3.Connection | None = None
        self._user_failed = False
        self._repaired = False  # a damaged user file was moved aside once already
        # Each system file is opened on its first lookup and kept open (None: absent or
        # unreadable): a network's first forward looks up dozens of problems, and opening the
        # file for each would add to the first result every time.
        self._system: dict[Path, sqlite3.Connection | None] = {}

    # -- reading -----------------------------------------------------------------------------

    def load(self, config: str) -> tuple[list[FindRecord], str] | None:
        """The ranking for ``config`` and where it came from (``user`` or the system file), or ``None``."""
        return self.load_user(config) or self.load_system(config)

    def load_user(self, config: str) -> tuple[list[FindRecord], str] | None:
        """The user file's ranking for ``config`` (where: ``user``), or ``None``. Apart from
        :meth:`load` so that a caller can put another source (a cluster's) between the two."""
        with self._lock:
            user = self._open_user(create=False)
            if user is not None:
                try:
                    found = _records(user, config)
                    if found:
                        return found, "user"
                except _READ_ERRORS as exc:
                    self._damaged(exc)
        return None

    def load_system(self, config: str) -> tuple[list[FindRecord], str] | None:
        """The first system file's ranking for ``config`` (where: its path), or ``None``."""
        for path in self.system_paths:
            with self._lock:
                conn = self._system_connection(path)
                if conn is None:
                    continue
                try:
                    found = _records(conn, config)
                except _READ_ERRORS as exc:
                    self._warn(f"fdb-system:{path}", f"system find-db {path} cannot be read ({exc}); skipped")
                    conn.close()
                    self._system[path] = None
                    continue
            if found:
                return found, str(path)
        return None

    def _system_connection(self, path: Path) -> sqlite3.Connection | None:
        if path not in self._system:
            conn = None
            if path.is_file():
                try:
                    conn = _connect(path, writable=False)
                except sqlite3.Error as exc:
                    self._warn(f"fdb-system:{path}", f"system find-db {path} cannot be read ({exc}); skipped")
            self._system[path] = conn
        return self._system[path]

    # -- writing -----------------------------------------------------------------------------

    def store(self, config: str, records: Sequence[FindRecord]) -> bool:
        """Replace ``config``'s ranking in the user file; ``False`` (with a warning) when it cannot."""
        with self._lock:
            user = self._open_user(create=True)
            if user is None:
                return False
            try:
                user.execute("BEGIN IMMEDIATE")
                try:
                    user.execute("DELETE FROM find_db WHERE config = ?", (config,))
                    user.executemany("INSERT INTO find_db VALUES (?, ?, ?, ?, ?, ?)",
                                     [(config, r.solver_id, r.solver, r.rank, r.time_ms, r.workspace)
                                      for r in records])
                    user.execute("COMMIT")
                except BaseException:
                    user.execute("ROLLBACK")
                    raise
                return True
            except sqlite3.Error as exc:
                self._damaged(exc)
                return False

    def close(self) -> None:
        with self._lock:
            if self._user is not None:
                self._user.close()
                self._user = None
            for conn in self._system.values():
                if conn is not None:
                    conn.close()
            self._system.clear()

    # -- the user file -----------------------------------------------------------------------

    def _open_user(self, create: bool) -> sqlite3.Connection | None:
        """The user file's connection; ``None`` when it cannot be used, or (reading) does not exist yet."""
        if self._user is not None or self._user_failed or self.user_path is None:
            return self._user
        if not create:
            # Reading creates nothing: only find writes a user find-db. Its absence is believed
            # for a moment (a first forward asks once per problem, dozens of stats), so a file
            # another process makes is seen at most USER_RECHECK_S later.
            now = time.monotonic()
            if now < self._user_absent_until:
                return None
            if not os.path.exists(self._user_path_str):
                self._user_absent_until = now + USER_RECHECK_S
                return None
        for attempt in range(2):  # a damaged file is moved aside once, then a new one made
            try:
                make_private_folders(self.user_path.parent)
                conn = _connect(self.user_path, writable=True)
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode = wal")
                for statement in _SCHEMA:
                    conn.execute(statement)
                self._check_meta(conn)
                for suffix in ("", "-wal", "-shm"):
                    make_file_private(Path(f"{self.user_path}{suffix}"))
                self._user = conn
                return conn
            except (sqlite3.DatabaseError, UnicodeDecodeError, _ForeignFile) as exc:
                if attempt == 0 and self._move_aside(exc):
                    continue
                self._give_up(exc)
            except (OSError, sqlite3.Error) as exc:
                self._give_up(exc)
            break
        return None

    def _check_meta(self, conn: sqlite3.Connection) -> None:
        meta = dict(conn.execute("SELECT key, value FROM find_meta").fetchall())
        if not meta:
            conn.executemany("INSERT OR IGNORE INTO find_meta VALUES (?, ?)",
                             [("schema", str(SCHEMA_VERSION)), ("target", self._target),
                              ("producer", self._producer)])
        elif meta.get("schema") != str(SCHEMA_VERSION) or meta.get("target") != self._target:
            raise _ForeignFile(f"it holds schema {meta.get('schema')} for target {meta.get('target')}")

    def _move_aside(self, exc: BaseException) -> bool:
        assert self.user_path is not None
        aside = self.user_path.with_name(f"{self.user_path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-"
                                         f"{os.getpid()}")
        try:
            if self.user_path.exists():
                os.replace(self.user_path, aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.user_path}{suffix}").unlink(missing_ok=True)
        except OSError:
            return False
        self._warn(f"fdb-corrupt:{self.user_path}", f"user find-db {self.user_path} was not usable ({exc}); moved "
                   f"it to {aside.name} and started a new one: find will time those problems again")
        return True

    def _damaged(self, exc: Exception) -> None:
        """A read or write failed: a damaged file is moved aside once (the next use starts a new
        one, in this process and the next), any other failure stops using the file."""
        if self._user is not None:
            self._user.close()
            self._user = None
        if isinstance(exc, sqlite3.DatabaseError) and not self._repaired:
            self._repaired = True
            if self._move_aside(exc):
                return
        self._warn(f"fdb-error:{self.user_path}", f"user find-db {self.user_path}: {exc}; rankings are not saved")
        self._user_failed = True

    def _give_up(self, exc: BaseException) -> None:
        self._user_failed = True
        self._warn(f"fdb-open:{self.user_path}", f"user find-db {self.user_path} cannot be used ({exc}); find "
                   "results are not saved (set KDB_USER_DB_PATH to a writable folder)")


class _ForeignFile(Exception):
    """A user find-db file for another target or schema."""

