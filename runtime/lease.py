"""Compile-once leases: whoever holds a program key's lease is the one that compiles it.

The JIT (``kdbkit.runtime.jit``) holds, for the key it is about to compile, first the
process's :data:`THREAD_LEASE` (threads of this process queue up here, and nowhere else), then
the lease of every tier in the chain that offers one (:meth:`Source.lease`), in chain order, so
that every process takes them in the same order and none waits on another in a cycle. Under
them it re-checks the tiers, compiles and writes through. A tier shared by several machines
offers a lease that those machines share; the user cache offers :class:`FileLease`, a file per
key in its folder.

A lease only saves work: when it cannot be taken (a read-only folder, a server that does not
answer) its holder warns once and compiles anyway, so two holders may compile the same
program, which is slower and never wrong.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import ContextManager, Iterator

from filelock import FileLock, Timeout

from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.program_key import ProgramKey

_log = get_logger(__name__)
# Longer than any sane compile; past it we compile anyway rather than wait forever.
LOCK_TIMEOUT_S = 600.0


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
    """One thread lock per key, alive only while a thread holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, list] = {}  # key -> [lock, users]
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
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
        return _thread_locks.hold(key.digest)


THREAD_LEASE = ThreadLease()


class FileLease(CompileLease):
    """A lock file per key (``<folder>/<digest>.lock``), an ``flock`` that the kernel releases if
    its holder dies, so a crashed process leaves no stale lease.

    Args:
        folder: where the lock files live (made on first use).
    """

    def __init__(self, folder: Path):
        self.folder = folder

    @contextmanager
    def hold(self, key: ProgramKey) -> Iterator[None]:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(self.folder / f"{key.digest[:40]}.lock"), timeout=LOCK_TIMEOUT_S)
            _log.trace("waiting for the compile lock of %s", key)
            lock.acquire()
        except (OSError, Timeout) as exc:
            warn_once(f"jit-lock:{self.folder}", f"Cannot take compile locks in {self.folder} ({exc}); processes "
                      "may compile the same program concurrently (results stay correct).", logger=_log)
            yield
            return
        try:
            yield
        finally:
            lock.release()
