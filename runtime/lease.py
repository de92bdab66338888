"""Compile-once leases: whoever holds a program key's lease is the one that compiles it.

The JIT (``kdbkit.runtime.jit``) holds, for the key it is about to compile, first the
process's :data:`THREAD_LEASE` (threads of this process queue up here, and nowhere else), then
the lease of every tier in the chain that offers one (:meth:`Source.lease`), in chain order, so
that every process takes them in the same order and none waits on another in a cycle. Under
them it re-checks the tiers, compiles and writes through. A tier shared by several machines
offers a lease that those machines share; the user cache offers :class:`FileLease`, a file per
key in its folder. A wait for a lease held by someone else is logged and bounded
(:mod:`kdbkit.runtime.lock_wait`): past ``KDB_COMPILE_LOCK_WAIT`` seconds the waiter compiles too.

A lease only saves work: when it cannot be taken (a read-only folder, a server that does not
answer) its holder warns once and compiles anyway, so two holders may compile the same
program, which is slower and never wrong.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import threading
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import ContextManager, Iterator

from kdbkit.kdb.private_files import FILE_MODE, FOLDER_MODE, make_private_folders
from kdbkit.runtime.lock_wait import wait_for
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.program_key import ProgramKey

_log = get_logger(__name__)


class CompileLease(ABC):
    """The right to compile one program key, held by one holder at a time."""

    @abstractmethod
    def hold(self, key: ProgramKey) -> ContextManager[None]:
        """Wait for and hold ``key``'s lease for the ``with`` block; never raises for a lease
        that cannot be taken (warn once and let the block run: it compiles twice at worst)."""


class held:
    """Hold ``lease`` for ``key`` around a ``with`` block; a lease that cannot be taken or released
    (its server is down) is one warning, and the block's own outcome, its result or its error,
    is never replaced or swallowed by the lease's: a lease only saves work."""

    def __init__(self, lease: CompileLease, key: ProgramKey):
        self._lease, self._key, self._hold = lease, key, None

    def __enter__(self) -> None:
        try:
            hold = self._lease.hold(self._key)
            hold.__enter__()
            self._hold = hold
        except Exception as exc:
            self._warn("lease-failed", "cannot be taken", exc, "compiling without it (another holder may compile "
                       "the same program)")

    def __exit__(self, *exc_info) -> bool:
        if self._hold is not None:
            try:
                self._hold.__exit__(*exc_info)
            except Exception as exc:
                self._warn("lease-release", "was not released cleanly", exc, "")
        return False

    def _warn(self, kind: str, what: str, exc: Exception, then: str) -> None:
        name = type(self._lease).__name__
        warn_once(f"{kind}:{name}", f"compile lease {name} {what} ({type(exc).__name__}: {exc})"
                  + (f"; {then}" if then else ""), logger=_log)


class _KeyLocks:
    """One thread lock per key, alive only while a thread holds or waits for it; a wait is
    bounded and logged as a lock file's is (:mod:`kdbkit.runtime.lock_wait`)."""

    def __init__(self) -> None:
        self._locks: dict[str, list] = {}  # key -> [lock, users, holder's thread name, since (monotonic)]
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, key: str, program: str = "") -> Iterator[None]:
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0, "", 0.0])
            entry[1] += 1

        def holder() -> str:
            return f"thread {entry[2]!r} of this process, for {time.monotonic() - entry[3]:.1f} s"

        taken = False
        try:
            taken = wait_for(lambda timeout: entry[0].acquire(timeout=timeout) if timeout > 0
                             else entry[0].acquire(blocking=False),
                             program=program or key, lock="this process's thread lock", holder=holder)
            if taken:
                entry[2], entry[3] = threading.current_thread().name, time.monotonic()
            yield
        finally:
            if taken:
                entry[0].release()
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)


_thread_locks = _KeyLocks()


class ThreadLease(CompileLease):
    """Per-key thread locks of this process, kept only while some thread holds or waits for one,
    so a process that compiles a million programs keeps none."""

    def hold(self, key: ProgramKey) -> ContextManager[None]:
        return _thread_locks.hold(key.digest, str(key))


THREAD_LEASE = ThreadLease()


class FileLease(CompileLease):
    """A lock file per key (``<folder>/<digest>.lock``), an ``flock`` that the kernel releases if
    its holder dies, so a crashed process leaves no stale lease; a stalled holder is waited on for
    :func:`~kdbkit.runtime.lock_wait.wait_bound` only. The holder writes its process id, host and
    start time into the file, for the waiters' log lines.

    The folder is made 0700 and each file 0600 whatever the umask: a lock file tells others what
    a user compiles, and one writable by others would let them hold every compile back.

    Lock files stay after their release, one per program compiled: deleting an ``flock`` file
    races (a waiter blocked on the deleted file and a newcomer who creates a new one would both
    hold "the" lock), so idle ones are deleted only when no compile holds them (each taken
    without waiting first), and what is left of that race costs a second compile, never a wrong
    binary: by ``kdb cache prune`` (``--lock-days``), and by a release that finds more than
    :data:`MAX_LOCK_FILES` in the folder, which removes those idle for :data:`IDLE_LOCK_S`, so
    the folder does not grow one file per program forever. One file per key, not a fixed set of
    shared stripes, so that two programs never wait on each other.

    Args:
        folder: where the lock files live (made on first use).
    """

    def __init__(self, folder: Path):
        self.folder = folder

    @contextmanager
    def hold(self, key: ProgramKey) -> Iterator[None]:
        path = self.folder / f"{key.digest[:40]}.lock"
        try:
            fd = _open_private(self.folder, path)
        except OSError as exc:
            warn_once(f"jit-lock:{self.folder}", f"Cannot take compile locks in {self.folder} ({exc}); processes "
                      "may compile the same program concurrently (results stay correct).", logger=_log)
            yield
            return
        try:
            if wait_for(lambda timeout: _flock(fd, timeout), program=str(key), lock=str(path),
                        holder=lambda: _holder(fd)):
                _write_holder(fd)
            yield
        finally:
            os.close(fd)  # releases the flock, if taken
        _prune_idle_locks(self.folder)


MAX_LOCK_FILES = 1024  # a release that finds more removes the idle ones
IDLE_LOCK_S = 3600.0


def _prune_idle_locks(folder: Path) -> None:
    """Remove lock files untouched for :data:`IDLE_LOCK_S` that no compile holds, once the folder
    holds more than :data:`MAX_LOCK_FILES` (a listing after a compile, which costs far more)."""
    try:
        with os.scandir(folder) as listing:
            entries = [e for e in listing if e.name.endswith(".lock")]
    except OSError:
        return
    if len(entries) <= MAX_LOCK_FILES:
        return
    cutoff = time.time() - IDLE_LOCK_S
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            fd = os.open(entry.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a compile holds it: it stays
            os.unlink(entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)


def _open_private(folder: Path, path: Path) -> int:
    make_private_folders(folder)
    if stat.S_IMODE(folder.stat().st_mode) != FOLDER_MODE:
        os.chmod(folder, FOLDER_MODE)  # one made by an older kdbkit, or by hand, kept its own mode
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:  # os.open's mode is cut by the umask
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def _flock(fd: int, timeout: float) -> bool:
    """Take ``fd``'s flock within ``timeout`` seconds (polling: flock itself waits without bound)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _write_holder(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.time():.3f}\n".encode(), 0)
    except OSError:
        pass  # the note is for log lines only


def _holder(fd: int) -> str:
    """Who holds the lock, from the note its holder wrote."""
    try:
        pid, host, since = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
        return f"process {pid} on {host}, for {time.time() - float(since):.1f} s"
    except (OSError, ValueError):
        return "another process"
