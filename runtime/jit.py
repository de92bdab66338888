"""The last tier of the chain: compile once between all processes and threads, then store.

``JitSource.get`` is lock -> re-check -> compile -> store. The lock is a file per program
key (``<cache>/locks/<digest>.lock``, an ``flock`` that the kernel releases if its holder
dies, so a crashed process leaves no stale lock) plus a thread lock per key inside the
process; thread locks live only while some thread holds or waits for them, so a process that
compiles a million programs keeps none. Other keys are never blocked, and neither are readers
of the user cache: compilation runs outside any database transaction, and the store is one
short write. When no lock file can be made (read-only cache folder), each process compiles
for itself: slower, never wrong.

The source text is read once (:meth:`KernelSearchPath.read`): the key the binary is stored
under is made from the digest of the very bytes compiled, so an edit made since the handle
was made lands under its own key, never under the old one.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from kdbkit.kdb.target import Target
from kdbkit.runtime.compilers import LazyCompiler
from kdbkit.runtime.errors import CompilerUnavailableError, JitDisabledError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.lookup import Keys, Source, UserCacheSource
from kdbkit.runtime.program import Steps
from kdbkit.runtime.program_key import ProgramKey, ProgramRequest, program_key
from kdbkit.runtime.user_cache import UserCache

_log = get_logger(__name__)
# Longer than any sane compile; past it we compile anyway rather than wait forever.
LOCK_TIMEOUT_S = 600.0


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


@contextmanager
def key_lock(lock_dir: Path | None, key: ProgramKey) -> Iterator[None]:
    """Hold the per-key lock across threads of this process and across processes."""
    with _thread_locks.hold(key.digest):
        if lock_dir is None:
            yield
            return
        try:
            lock_dir.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(lock_dir / f"{key.digest[:40]}.lock"), timeout=LOCK_TIMEOUT_S)
            _log.trace("waiting for the compile lock of %s", key)
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
               compile_fn: Callable[[], bytes]) -> tuple[bytes, bool]:
    """Return the program's binary, compiling it only if nobody else has meanwhile.

    Args:
        key: the program's key in the user cache.
        cache: the user cache, or None when caching is disabled.
        lock_dir: folder for lock files, or None for in-process locking only.
        compile_fn: the compiler call; runs at most once per key across processes.

    Returns:
        (binary, True if this call compiled it; False if another process or thread stored it
        while this one waited for the lock).
    """
    with key_lock(lock_dir, key):
        if cache is not None:
            cached = cache.get(key)  # re-check: the lock holder before us may have built it
            if cached is not None:
                return cached, False
        binary = compile_fn()
        if cache is not None:
            cache.put(key, binary)
        return binary, True


class JitSource(Source):
    """Compile (unless ``KDB_DISABLE_JIT``) and store in the user cache.

    Args:
        target: what to compile for.
        keys: the handle's keys; the digest of what is compiled replaces the remembered one.
        compiler: the local compiler, found on first use (CompilerUnavailableError, with
            the reason, when there is none).
        store: the user-cache source whose cache is re-checked and stored into, or None
            (``KDB_DISABLE_CACHE``).
        allowed: False under ``KDB_DISABLE_JIT``: a miss is then an error naming the program.
        searched: what the tiers before this one searched, for that error.
    """

    name = "jit"

    def __init__(self, target: Target, keys: Keys, compiler: LazyCompiler, store: UserCacheSource | None,
                 allowed: bool, searched: Callable[[], str]):
        self.target = target
        self.keys = keys
        self.compiler = compiler
        self.store = store
        self.allowed = allowed
        self._searched = searched

    @property
    def search_path(self) -> KernelSearchPath:
        return self.keys.search_path

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        if not self.allowed:
            raise JitDisabledError(
                f"no program {request} for {self.target.full_arch} in {self._searched()}",
                f"unset KDB_DISABLE_JIT to compile it, or install the bundle {self.target.built_bundle_name()} "
                "(`kdb devices` shows the bundle each device would use)")
        compiler = self.compiler.get()
        identity = self.compiler.identity()  # the one the user-cache lookup keyed with
        reason = compiler.unsupported(self.target)
        if reason:
            raise CompilerUnavailableError(f"cannot compile {request}: {reason}", "use a device this compiler targets")
        source = self.search_path.read(request.kernel_file)  # one read: the key and the text agree
        self.keys.set_digest(request.kernel_file, source.digest)
        key = program_key(request, target=self.target, compiler=identity, source_digest=source.digest)
        cache = self.store.cache if self.store is not None else None
        lock_dir = cache.lock_dir if cache is not None and cache.usable else None
        with steps.time("jit") as t:
            binary, compiled = build_once(key, cache, lock_dir, lambda: compiler.compile(request, self.target, source))
            t.outcome = "compiled" if compiled else "built by another process"
        if compiled:
            _log.info("%s compiled for %s by %s in %.1f ms", request, self.target, identity, steps[-1].ms)
        return binary

    def discard(self, request: ProgramRequest) -> None:
        if self.store is not None:  # a binary just compiled that does not load must not stay cached
            self.store.discard(request)
