"""Compile a program once between all processes and threads: lock, re-check, build, store.

The lock is a file per program key (``<cache>/locks/<digest>.lock``, an ``flock`` that the
kernel releases if its holder dies, so a crashed process leaves no stale lock). Other keys
are never blocked, and neither are readers of the user cache: compilation runs outside
any database transaction, and the store is one short write. When no lock file can be
made (read-only cache folder), each process compiles for itself: slower, never wrong.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.program_key import ProgramKey
from kdbkit.runtime.user_cache import UserCache

_log = get_logger("runtime.jit")
# Longer than any sane compile; past it we compile anyway rather than wait forever.
LOCK_TIMEOUT_S = 600.0

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(digest: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(digest, threading.Lock())


@contextmanager
def key_lock(lock_dir: Path | None, key: ProgramKey) -> Iterator[None]:
    """Hold the per-key lock across threads of this process and across processes."""
    with _thread_lock(key.digest):
        if lock_dir is None:
            yield
            return
        try:
            lock_dir.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(lock_dir / f"{key.digest[:40]}.lock"), timeout=LOCK_TIMEOUT_S)
            lock.acquire()
        except (OSError, Timeout) as exc:
            warn_once(f"jit-lock:{lock_dir}", f"Cannot take compile locks in {lock_dir} ({exc}); processes may "
                      "compile the same program concurrently (results stay correct).", logger=_log)
            yield
            return
        try:
            yield
        finally:
            lock.release()


def build_once(key: ProgramKey, cache: UserCache | None, lock_dir: Path | None,
               compile_fn: Callable[[], bytes]) -> tuple[bytes, str]:
    """Return the program's binary, compiling it only if nobody else has meanwhile.

    Args:
        key: the program's key in the user cache.
        cache: the user cache, or None when caching is disabled.
        lock_dir: folder for lock files, or None for in-process locking only.
        compile_fn: the compiler call; runs at most once per key across processes.

    Returns:
        (binary, where it came from: ``"user"`` if another process stored it while we
        waited for the lock, else ``"jit"``).
    """
    with key_lock(lock_dir, key):
        if cache is not None:
            cached = cache.get(key)  # re-check: the lock holder before us may have built it
            if cached is not None:
                return cached, "user"
        binary = compile_fn()
        if cache is not None:
            cache.put(key, binary)
        return binary, "jit"
