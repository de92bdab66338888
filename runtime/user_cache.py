"""The per-user kernel cache (``<arch>.ukdb``): read, write, and survive when it can't.

One file per arch in :func:`runtime.paths.user_cache_dir`, shared by every process and
thread of the user, in WAL mode (readers never wait for a writer) with a busy timeout.
The file is arch-wide: the key holds the full arch and everything else that changes a
binary, so devices of one arch with different CU counts share entries.

Opening: an existing file is opened for reading and writing without any transaction (no
process ever waits on another to open it), and its metadata must describe what this process
would write: the same backend and arch, the same binary format, zstd blobs. Entries of another
compiler may sit in the file (each key names its compiler, so they are never returned to
this one); only a missing file is created, under SQLite's write lock so that racing creators
agree.

Trust: the folder is made private (0700, whatever the umask) and the file and its
``-wal``/``-shm`` 0600; a folder or file owned by another user (root aside) or writable by
group or others is refused with one warning (runtime/private_folder.py), and the process runs
without the cache, since anyone who can write there chooses the binaries this process runs.

Failure policy — the runtime must keep running:
- folder missing and not creatable, unsearchable, or the file cannot be opened: warn once
  with the path and the remedy, then run without the cache (JIT results stay in memory);
- a folder this process may not write (a prebuilt cache in a read-only image): the file is read
  without writing (opened ``immutable`` when SQLite cannot make its ``-shm`` there), one warning;
- the file is not a bundle, is damaged, claims a format this version does not read, or its
  metadata describes another target, format or codec: move it aside (``*.corrupt-<time>``,
  nothing is deleted; ``kdb cache clear`` removes it) and start a new one, at open or at the
  first read that finds the damage; a second failure in one process stops using the cache;
- an entry whose hash does not match: delete it, so the caller rebuilds it;
- a write fails (disk full, read-only): warn once and stop writing;
- the file is locked past SQLite's busy timeout (many processes opening or writing at once):
  retry with randomised exponential back-off for up to :data:`BUSY_RETRY_S`, as MIOpen does,
  before treating it as one of the failures above.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from pathlib import Path

from kdbkit.kdb import Bundle, BundleBusyError, CorruptBundleError, CorruptEntryError, KdbError, NotABundleError, Target
from kdbkit.kdb.errors import BundleNotFoundError, UnsupportedFormatError
from kdbkit.kdb.target import USER_SUFFIX
from kdbkit.runtime import env, private_folder
from kdbkit.runtime.cache_eviction import Evictor
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.program_key import ProgramKey

_log = get_logger("runtime.user_cache")
BUSY_RETRY_S = 30.0
LOCKS = "locks"  # sub-folder of the cache folder holding one compile lock per program key


def with_backoff(fn, retry_s: float = BUSY_RETRY_S):
    """Call ``fn``; while it raises BundleBusyError, retry after a random, doubling pause."""
    deadline = time.monotonic() + retry_s
    pause = 0.005
    while True:
        try:
            return fn()
        except BundleBusyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, 1.0)


DISABLE_HINT = "set KDB_CUSTOM_CACHE_DIR to a writable folder, or KDB_DISABLE_CACHE=1 to silence this"
CLEAR_HINT = "`kdb cache clear` empties the cache folder"
CODEC = "zstd"  # what kdbkit writes into user caches
JOURNALS = ("-wal", "-shm")


def damaged(exc: BaseException) -> bool:
    """Whether an error opening or reading a cache file means the file itself is bad (damaged,
    not a cache, of a format this version does not read), so that a fresh file is the cure.
    A busy or unwritable file is not damaged. A reader may fail on a damaged metadata value
    with a plain Python error before it raises kdbkit's own."""
    if isinstance(exc, (NotABundleError, CorruptBundleError, UnsupportedFormatError)):
        return not isinstance(exc, BundleBusyError)
    return isinstance(exc, (KeyError, ValueError, TypeError, sqlite3.DatabaseError)) and not isinstance(exc, KdbError)


def folder_writable(folder: Path) -> tuple[bool, str]:
    """Whether files can be created in ``folder`` (made first if missing), and what decided it.

    The nearest existing ancestor must be a folder this process may write and enter: a
    regular file on the way means the folder can never be made.
    """
    probe = folder
    while not os.path.exists(probe) and probe != probe.parent:  # os.path: never raises for an unsearchable parent
        probe = probe.parent
    if not os.path.isdir(probe):
        return False, f"{probe} is a file, so {folder} cannot be created"
    if not os.access(probe, os.W_OK | os.X_OK):
        return False, f"{probe} is not writable"
    return True, str(probe)


class ForeignCacheError(CorruptBundleError):
    """A user cache file whose metadata describes another target, binary format or codec."""


class UserCache:
    """Lazily opened user cache for one arch.

    Args:
        folder: where the ``.ukdb`` lives.
        target: the device's target (its arch-wide form names the file).
        compiler: identity of the local compiler, recorded in a new file's metadata.
        binary_format: what the backend loads.
        writable: False under ``KDB_CACHE_POLICY=readonly``: an existing file is read as it is;
            nothing is made, stored, deleted or repaired.
    """

    def __init__(self, folder: Path, target: Target, *, compiler: str, binary_format: str, writable: bool = True):
        self.path = folder / target.arch_wide().bundle_name(USER_SUFFIX)
        self._target = Target(target.backend, target.arch)
        self._compiler = compiler
        self._binary_format = binary_format
        self._bundle: Bundle | None = None
        self._broken = False  # set once: no more reads or writes this process
        self._writable = writable
        self._read_only = not writable
        self._repaired = False  # a damaged file found by a read was moved aside once already
        self._lock = threading.Lock()
        self._evictor = Evictor(self.path, env.get_size("KDB_CACHE_MAXSIZE"))

    @property
    def usable(self) -> bool:
        return not self._broken

    @property
    def read_only(self) -> bool:
        """Whether this process stores nothing here (a read-only folder, or a write failed)."""
        return self._read_only

    @property
    def is_open(self) -> bool:
        return self._bundle is not None

    @property
    def lock_dir(self) -> Path:
        """Where the per-key compile locks of this cache live."""
        return self.path.parent / LOCKS

    def _open(self) -> Bundle | None:
        with self._lock:
            if self._broken:
                return None
            if self._bundle is None:
                self._bundle = self._open_or_repair()
                self._broken = self._bundle is None
            return self._bundle

    def _open_or_repair(self) -> Bundle | None:
        folder = self.path.parent
        if not self._writable:
            return self._open_as_found()
        why = private_folder.make_private_folder(folder)
        if why and not os.path.isdir(folder):
            return self._give_up(why)
        why = why or self._untrusted_file()
        if why:
            return self._refuse(why)
        if not os.access(folder, os.W_OK):
            return self._open_read_only(f"{folder} is not writable")
        for attempt in (1, 2):
            try:
                bundle = with_backoff(self._open_checked)
            except Exception as exc:
                if not damaged(exc):
                    if isinstance(exc, KdbError):
                        return self._open_read_only(exc.problem)
                    raise
                if attempt == 2 or not self._move_aside(exc):
                    return self._give_up(_problem(exc))
                continue
            for suffix in ("",) + JOURNALS:
                private_folder.make_file_private(Path(f"{self.path}{suffix}"))
            return bundle
        return None

    def _untrusted_file(self) -> str | None:
        """Why the cache file or a journal beside it may hold what another user wrote, or None."""
        for suffix in ("",) + JOURNALS:
            why = private_folder.untrusted(Path(f"{self.path}{suffix}"))
            if why:
                return why
        return None

    def _refuse(self, why: str) -> None:
        private_folder.warn_refused(self.path.parent, why)
        return None

    def _open_checked(self) -> Bundle:
        """Open the existing file without a transaction, or create it if there is none."""
        try:
            bundle = Bundle.open(self.path, writable=True, wal=True)
        except (BundleNotFoundError, NotABundleError):
            # Missing, or an SQLite file without tables yet: another process may be creating it
            # right now. Creating takes SQLite's write lock, which waits for that process and
            # then finds its tables; a file that is not SQLite at all fails here too and is moved aside.
            bundle = Bundle.create(self.path, self._target, compiler=self._compiler,
                                   binary_format=self._binary_format, wal=True, exist_ok=True)
        why = self._foreign(bundle)
        if why:
            bundle.close()
            raise ForeignCacheError(f"{self.path}: {why}")
        return bundle

    def _foreign(self, bundle: Bundle) -> str | None:
        """Why an existing file's metadata is not that of this cache, or None."""
        md = bundle.metadata
        if md.target is None or (md.target.backend, md.target.arch) != (self._target.backend, self._target.arch):
            return f"it holds binaries for {md.target or 'no named target'}, not {self._target}"
        if md.binary_format != self._binary_format:
            return f"it holds {md.binary_format or 'unnamed'} binaries, not {self._binary_format}"
        if md.codec != CODEC:
            return f"its blobs are {md.codec}, not {CODEC}"
        if md.compiler != self._compiler:
            _log.info2("%s was created by %s; entries of %s are keyed apart from its own", self.path, md.compiler,
                       self._compiler)
        return None

    def _open_as_found(self) -> Bundle | None:
        """The file as it is, read only (``KDB_CACHE_POLICY=readonly``); None, quietly, if there
        is none, and with one warning if it is not to be trusted or cannot be read."""
        if not os.path.isfile(self.path):
            return None
        why = private_folder.untrusted(self.path.parent) or self._untrusted_file()
        if why:
            return self._refuse(why)
        return self._read_only_bundle() or self._give_up("it cannot be read")

    def _open_read_only(self, why: str) -> Bundle | None:
        """A cache we cannot write may still be read (a prebuilt cache in a read-only image)."""
        bundle = self._read_only_bundle()
        if bundle is None:
            return self._give_up(why)
        self._stop_writing(why)
        return bundle

    def _read_only_bundle(self) -> Bundle | None:
        """The file opened read-only, if it is one of this cache's. SQLite reads a WAL file
        read-only only through its ``-shm``; where the folder does not let it make one, the file
        is opened ``immutable`` (no locks, no journal: nothing can change it there anyway)."""
        if not os.path.isfile(self.path):
            return None
        bundle = None
        for immutable in (False, True):
            try:
                bundle = Bundle.open(self.path, immutable=immutable)
                break
            except Exception as exc:
                if not isinstance(exc, KdbError) and not damaged(exc):
                    raise
        if bundle is None:
            return None
        if self._foreign(bundle):
            bundle.close()
            return None
        return bundle

    def _move_aside(self, exc: BaseException) -> bool:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
            for suffix in JOURNALS:
                Path(str(self.path) + suffix).unlink(missing_ok=True)
        except OSError:
            return False
        what = "was not a cache for this device" if isinstance(exc, ForeignCacheError) else "was damaged"
        warn_once(f"ukdb-corrupt:{self.path}",
                  f"User kernel cache {self.path} {what} ({_problem(exc)}); moved it to {aside} and started a "
                  f"new one. Programs it held will be compiled again; {CLEAR_HINT} of such files.", logger=_log)
        return True

    def _give_up(self, why: str) -> None:
        warn_once(f"ukdb-unusable:{self.path}",
                  f"User kernel cache {self.path} is unusable: {why}. Running without it: compiled programs are "
                  f"kept in memory only and recompiled in every new process; {CLEAR_HINT}, or "
                  f"{DISABLE_HINT}.", logger=_log)
        return None

    def warm_up(self) -> None:
        """Open the cache now if its file exists, and do a first read's one-time work (see
        :meth:`kdb.Bundle.warm_up`); nothing is created here, and a broken cache warns as usual."""
        if os.path.isfile(self.path) and (bundle := self._open()) is not None:  # never raises, unlike Path's
            bundle.warm_up()  # best effort: it swallows errors, which the get that needs it reports

    def get(self, key: ProgramKey) -> bytes | None:
        """The cached binary, or None (absent, corrupt and now removed, or cache unusable)."""
        bundle = self._open()
        if bundle is None:
            return None
        try:
            binary = with_backoff(lambda: bundle.get(key.kernel_name, key.kernel_args))
        except CorruptEntryError as exc:
            _log.warning("%s; removing the entry so that it is rebuilt", exc.problem)
            self._delete(bundle, key)
            return None
        except Exception as exc:
            if not isinstance(exc, KdbError) and not damaged(exc):
                raise
            if not (damaged(exc) and self._repair(exc)):
                self._break(exc)
            return None
        if binary is not None:
            self._evictor.used(key.kernel_name, key.kernel_args)
        return binary

    def _repair(self, exc: BaseException) -> bool:
        """Move a file a read found damaged aside, once per process, so that the next use starts
        a new one (other processes then open the new file too, instead of failing on the old)."""
        with self._lock:
            if self._repaired or self._read_only or self._bundle is None:
                return False
            self._repaired = True
            bundle, self._bundle = self._bundle, None
        bundle.close()
        self._evictor.forget_file()
        return self._move_aside(exc)

    def _break(self, exc: BaseException) -> None:
        """Stop using the file for the rest of this process: no more reads, no more writes."""
        with self._lock:
            self._broken = True
            bundle, self._bundle = self._bundle, None
        if bundle is not None:
            bundle.close()
        self._give_up(_problem(exc))

    def discard(self, key: ProgramKey) -> None:
        """Remove an entry that decoded but does not load, so that it is rebuilt."""
        bundle = self._open()
        if bundle is not None and not self._read_only:
            self._delete(bundle, key)

    def _delete(self, bundle: Bundle, key: ProgramKey) -> None:
        if self._read_only:  # a damaged entry in a cache this process does not write is only skipped
            return
        try:
            with_backoff(lambda: bundle.delete(key.kernel_name, key.kernel_args))
        except KdbError as exc:
            self._stop_writing(exc.problem)

    def put(self, key: ProgramKey, binary: bytes) -> bool:
        """Store a binary; False (after one warning) if the cache cannot be written."""
        bundle = self._open()
        if bundle is None or self._read_only:
            return False
        try:
            with_backoff(lambda: bundle.put(key.kernel_name, key.kernel_args, binary))
        except KdbError as exc:
            self._stop_writing(exc.problem)
            return False
        try:
            self._evictor.stored(key.kernel_name, key.kernel_args)
        except sqlite3.Error as exc:  # the entry is stored; only the bound is late
            warn_once(f"ukdb-evict:{self.path}", f"Cannot keep the user kernel cache {self.path} under "
                      f"KDB_CACHE_MAXSIZE ({exc}); it may grow past it until this is fixed.", logger=_log)
        return True

    def _stop_writing(self, why: str) -> None:
        self._read_only = True
        warn_once(f"ukdb-write:{self.path}",
                  f"Cannot write the user kernel cache {self.path}: {why}. New programs are kept in memory only; "
                  f"{DISABLE_HINT}.", logger=_log)

    def close(self) -> None:
        if self._bundle is not None and not self._read_only:
            self._evictor.close()
        with self._lock:
            if self._bundle is not None:
                self._bundle.close()
                self._bundle = None


def _problem(exc: BaseException) -> str:
    """What went wrong, for a message: kdbkit's own text, else the Python error."""
    return exc.problem if isinstance(exc, KdbError) else f"{type(exc).__name__}: {exc}"
