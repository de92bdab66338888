"""The lookup chain: the in-process tier, then a list of sources, each tried in order.

Every tier below memory is a :class:`~kdbkit.runtime.tier.Source` answering
``get(request)`` with a binary or nothing; the chain loads the first binary it gets, and a
binary that fails to load is discarded from its source and the next source is tried, so a
wrong binary is never used. The default chain (``Handle``, assembled by
``kdbkit.runtime.cache_sources``) is::

    memory -> system bundles -> user cache -> JIT (lease, re-check, compile, put to every writable tier)

Adding a tier (a remote cache shared by a cluster) is adding one source to the list
(``Handle(sources=...)`` or ``KDB_CACHE_SOURCES``). The memory tier is the one tier that keeps
*loaded* programs rather than bytes, since loading a binary again is the cost it exists to
save; it remembers whatever a later tier found.

Each source computes its own key with :func:`kdbkit.runtime.program_key.program_key`: a
system bundle with the compiler it records, the user cache with the local compiler, the JIT
with the digest of the very text it compiles. A source never raises for a bad entry or a
damaged file: it warns once and answers nothing.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from kdbkit.kdb import Bundle, CorruptEntryError, KdbError, Target
from kdbkit.runtime import paths, tier_stats
from kdbkit.runtime.backends.base import BinaryLoadError, Module
from kdbkit.runtime.compilers import LazyCompiler
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.lease import CompileLease, FileLease
from kdbkit.runtime.logging_setup import INFO2, TRACE, get_logger, warn_once
from kdbkit.runtime.program import Program, Step, Steps
from kdbkit.runtime.program_key import KeyHasher, ProgramKey, ProgramRequest, key_hasher
from kdbkit.runtime.system_bundles import SystemBundleSearch
from kdbkit.runtime.tier import (REQUEST_ERRORS, Source, SourceCheck, SourceInfo, TierContext, WritableSource, discard,
                                 failed, searched, write_all)
from kdbkit.runtime.user_cache import UserCache, folder_writable
from kdbkit.runtime.write_behind import WriteBehind

_log = get_logger(__name__)
__all__ = ["Keys", "LookupChain", "MemorySource", "Source", "SystemBundleSource", "TierContext", "UserCacheSource",
           "WritableSource"]


class Keys:
    """Keys requests for one target, with each kernel file's digest as the handle first saw it.

    Args:
        target: the device's target.
        search_path: where kernel files are found.
        digests: digests taken when the handle was made (name -> digest); others are taken
            on first use and remembered.
    """

    def __init__(self, target: Target, search_path: KernelSearchPath, digests: dict[str, str] | None = None):
        self.target = target
        self.search_path = search_path
        self.digests = dict(digests or {})
        self._arch = target.full_arch
        self._hashers: dict[tuple[str, str], KeyHasher] = {}  # by (kernel file, compiler)

    def digest(self, kernel_file: str) -> str:
        digest = self.digests.get(kernel_file)
        if digest is None:
            digest = self.digests[kernel_file] = self.search_path.digest(kernel_file)
        return digest

    def set_digest(self, kernel_file: str, digest: str) -> None:
        """Key ``kernel_file``'s programs with ``digest`` from now on (the JIT read it again)."""
        if self.digests.get(kernel_file) != digest:
            self.digests[kernel_file] = digest
            for k in list(self._hashers):  # a snapshot: other threads may key meanwhile
                if k[0] == kernel_file:
                    self._hashers.pop(k, None)

    def key(self, request: ProgramRequest, compiler: str) -> ProgramKey:
        """:func:`~kdbkit.runtime.program_key.program_key` of ``request`` for ``compiler``,
        with the kernel file's fields encoded once per handle, not once per program."""
        hasher = self._hashers.get((request.kernel_file, compiler)) or self.hasher(request.kernel_file, compiler)
        return hasher.key(request.options)

    def hasher(self, kernel_file: str, compiler: str) -> KeyHasher:
        """Make and keep the key hasher of ``kernel_file``'s programs for ``compiler`` (key() calls it on a miss)."""
        hasher = self._hashers[kernel_file, compiler] = key_hasher(kernel_file, self._arch, self.digest(kernel_file),
                                                                   compiler)
        return hasher


class MemorySource(dict):
    """Programs this chain already loaded, by request (thread-safe).

    A dict of them, so that ``get`` runs in C: every lookup asks it first.
    """

    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def keep(self, program: Program) -> Program:
        """Remember ``program``; when another thread got there first, its program wins."""
        with self._lock:
            return self.setdefault(program.request, program)


class SystemBundleSource(Source):
    """Installed bundles that fit the device, best first, opened only as far as needed."""

    name = "system"
    title = "system bundles"
    immutable = True  # opened read-only and immutable: a re-check could find nothing new

    def __init__(self, search: SystemBundleSearch, keys: Keys):
        self.search = search
        self.keys = keys
        self._about: dict[Bundle, tuple[str, str]] = {}  # compiler and step name, made once per bundle

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        # One function from request to bytes (with the bundle's own get): a process's first
        # lookups run every frame of this path for the first time, and each costs microseconds.
        i = 0  # an index, not `for bundle in self.search`: a generator costs more than the rest of a miss
        while (bundle := self.search.get(i)) is not None:
            compiler, step_name = self._about.get(bundle) or self._first_seen(bundle)
            key = self.keys.key(request, compiler)
            t0 = time.perf_counter()  # timed by hand, as resolve() does: this runs on every lookup
            try:
                binary = bundle.get(key.kernel_name, key.kernel_args)
                outcome = "miss" if binary is None else "hit"
            except CorruptEntryError as exc:  # a damaged entry or file is a miss with one warning, never a crash
                warn_once(f"corrupt:{bundle.path}:{key}", f"{exc.problem}; skipping it ({exc.remedy})", logger=_log)
                binary, outcome = None, "corrupt"
            except KdbError as exc:  # the file itself is damaged where this lookup reads it
                warn_once(f"damaged:{bundle.path}", f"{exc.problem}; looking elsewhere ({exc.remedy})", logger=_log)
                binary, outcome = None, "damaged"
            steps.append(Step(step_name, (time.perf_counter() - t0) * 1e3, outcome))
            if _log.isEnabledFor(TRACE):
                _log.trace("%s %s: %s", bundle.path.name, key, outcome)
            if binary is not None:
                return binary
            i += 1
        if self.search.found_none:
            self.warn_missing()
        return None

    def _first_seen(self, bundle: Bundle) -> tuple[str, str]:
        """What every lookup in ``bundle`` needs of it: its compiler (keys) and its step's name."""
        return self._about.setdefault(bundle, (bundle.metadata.compiler, f"system {bundle.path.name}"))

    def warn_missing(self) -> None:
        """Say once per process that no system bundle fits the device, and why each candidate was not used."""
        name = self.search.target.built_bundle_name()
        if warn_once(f"missing-system-db:{name}", f"Missing system database file: {name} Performance may degrade",
                     logger=_log):
            for c in self.search.trace:
                if c.status == "rejected":
                    _log.warning("system bundle %s not used: %s", c.path, c.reason)

    def searched(self) -> str:
        accepted = [str(c.path) for c in self.search.trace if c.status == "accepted"]
        return ", ".join(accepted) if accepted else f"no system bundle ({self.search.target.built_bundle_name()} missing)"

    def describe(self) -> SourceInfo:
        self.search.get(0)  # the best bundle, as the handle's first lookup opens it
        return SourceInfo(self.name, self.searched(), self.writable)

    def close(self) -> None:
        self.search.close()


class UserCacheSource(WritableSource):
    """The per-user ``.ukdb``, keyed with the local compiler's identity.

    The cache is made on first use, since it needs that identity (the compiler is looked up
    then); without a local compiler it answers nothing, as its entries could not be matched.

    Args:
        keys: the handle's keys.
        compiler: the local compiler, found on first use.
        binary_format: what the backend loads, recorded in a new file.
        folder: gives the cache folder (``KDB_CUSTOM_CACHE_DIR`` or the per-user one).
        writable: False where the cache policy is ``readonly``: read, never written or repaired.
    """

    name = "user"
    title = "user cache"

    def __init__(self, keys: Keys, compiler: LazyCompiler, binary_format: str,
                 folder: Callable[[], Path] = paths.user_cache_dir, *, writable: bool = True):
        self.writable = writable
        self.keys = keys
        self.compiler = compiler
        self.binary_format = binary_format
        self._folder = folder
        self._cache: UserCache | None = None
        self._lock = threading.Lock()
        self._lease: FileLease | None = None

    @property
    def cache(self) -> UserCache | None:
        """The user cache, or None when there is no local compiler to key its entries with."""
        if self._cache is None:
            identity = self.compiler.identity()
            if identity is None:
                return None
            with self._lock:
                if self._cache is None:
                    self._cache = UserCache(self._folder(), self.keys.target, compiler=identity,
                                            binary_format=self.binary_format, writable=self.writable)
        return self._cache

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        cache = self.cache
        if cache is None:
            return None
        key = self.keys.key(request, self.compiler.identity())
        with steps.time("user") as t:
            binary = cache.get(key)
            if binary is not None:
                t.outcome = "hit"
        if _log.isEnabledFor(TRACE):
            _log.trace("%s %s: %s", cache.path.name, key, t.outcome)
        return binary

    def put(self, request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
        cache = self.cache
        if cache is not None:
            cache.put(key, binary)  # a cache that cannot be written warns once and keeps nothing

    def discard(self, request: ProgramRequest) -> None:
        if self.cache is not None:
            self.cache.discard(self.keys.key(request, self.compiler.identity()))

    @property
    def folder(self) -> Path:
        """The cache's folder (made on first use)."""
        return self._folder()

    def lease(self) -> CompileLease | None:
        """A lock file per key in the cache folder's ``locks/``; none once the cache is unusable or
        read-only (a read-only folder, or a handle that only reads it: nothing compiled here is
        stored there for another process to find)."""
        cache = self.cache
        if cache is None or not cache.usable or cache.read_only:
            return None
        if self._lease is None:
            self._lease = FileLease(cache.lock_dir)
        return self._lease

    def searched(self) -> str:
        return f"the user cache {self._cache.path}" if self._cache is not None else ""

    def describe(self) -> SourceInfo:
        cache = self.cache
        return SourceInfo(self.name, str(cache.path if cache is not None else self._folder()), self.writable)

    def checks(self) -> list[SourceCheck]:
        from kdbkit.runtime import cache_admin

        folder = self._folder()
        writable, why = folder_writable(folder)
        rows = [SourceCheck("folder", str(folder)),
                SourceCheck("writable", f"{'yes' if writable else 'NO'} ({why})", writable)]
        for f in cache_admin.list_cache(folder) if folder.is_dir() else []:
            rows.append(SourceCheck(f.path.name, f.problem or f"{f.entries} entries, {f.file_bytes} bytes",
                                    f.problem is None))
        return rows

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()


class LookupChain:
    """Memory, then ``sources`` in order; the first binary that loads wins.

    Args:
        sources: the tiers below memory, in the order they are asked.
        load: turns a binary into a loaded module (the backend's ``load``).
        device_name: for messages.
    """

    def __init__(self, sources: Sequence[Source], load: Callable[[bytes], Module], device_name: str = "the device",
                 key_of: Callable[[ProgramRequest], ProgramKey | None] | None = None):
        self.memory = MemorySource()
        self.sources = list(sources)
        # A hit below a writable tier is written through to it (a cluster cache's hit into the
        # user cache: the network is paid once per program), keyed as the JIT keys.
        self._key_of = key_of
        self._writes = WriteBehind()
        self._load = load
        self._device_name = device_name
        # Programs this chain resolved below memory, by the tier that served each ("system",
        # "user", "jit"): what a run reports as its resolutions by source.
        self.resolved: collections.Counter[str] = collections.Counter()

    def resolve(self, request: ProgramRequest) -> Program:
        """The program for ``request`` from the first tier that has it.

        Raises:
            Whatever the last source raises when it cannot serve the request (the JIT:
            JitDisabledError, CompilerUnavailableError, CompileError), or the
            BinaryLoadError of the last binary that did not load.
        """
        steps = Steps()
        t0 = time.perf_counter()  # timed by hand: this runs on every call, a context manager costs more
        known = self.memory.get(request)
        steps.append(Step("memory", (time.perf_counter() - t0) * 1e3, "miss" if known is None else "hit"))
        if known is not None:
            return known.seen_again(steps)
        failure: BinaryLoadError | None = None
        try:
            for source in self.sources:
                program, unloadable = self._from(source, request, steps)
                if program is not None:
                    return program
                failure = unloadable or failure
        finally:
            tier_stats.PROCESS.note_steps(steps)  # kdb cache stats: how each tier served
        if failure is not None:
            raise failure
        raise KdbError(f"no source has {request}: {', '.join(w for w in map(searched, self.sources) if w)}",
                       "this chain has no tier that compiles (jit): add one, or install a bundle that holds it")

    def preload(self, request: ProgramRequest, source: Source) -> Program | None:
        """The program for ``request`` from memory, else from ``source`` alone, kept in memory (a
        background prefetch: it never compiles); None when the source has no loadable binary."""
        known = self.memory.get(request)
        if known is not None:
            return known
        return self._from(source, request, Steps())[0]

    def _from(self, source: Source, request: ProgramRequest, steps: Steps) -> tuple[Program | None, BinaryLoadError | None]:
        """``source``'s binary for ``request``, loaded and kept in memory; else why it did not load."""
        try:  # not tier.read(): no clock read for a fault on this path, which every lookup below memory takes
            binary = source.get(request, steps)
        except REQUEST_ERRORS:  # the request's own error (no such kernel file), not the tier's
            raise
        except Exception as exc:
            if source.compiles:  # its errors say why the request cannot be served
                raise
            binary = failed(source, exc, steps, 0.0)  # a miss with one warning
        if binary is None:
            return None, None
        t0 = time.perf_counter()  # timed by hand: this runs on every lookup below memory
        try:
            module = self._load(binary)
        except BinaryLoadError as exc:
            steps.append(Step("load", (time.perf_counter() - t0) * 1e3, "unloadable"))
            warn_once(f"unloadable:{source.name}:{request}", f"{source.name}: {request} does not load on "
                      f"{self._device_name}: {exc.problem}; skipping it", logger=_log)
            discard(source, request)
            return None, exc
        steps.append(Step("load", (time.perf_counter() - t0) * 1e3, "loaded"))
        if self._key_of is not None and not source.compiles:
            self._write_through(source, request, binary)
        program = self.memory.keep(Program(request, module, source.name, steps))
        if program.module is module:  # another thread may have kept the same program first
            self.resolved[source.name] += 1
        if _log.isEnabledFor(INFO2):
            _log.info2("%s: %s", request, ", ".join(f"{s.name} {s.outcome} {s.ms:.3f} ms" for s in steps))
        return program, None

    def _write_through(self, source: Source, request: ProgramRequest, binary: bytes) -> None:
        before = [t for t in self.sources[:self.sources.index(source)] if t.writable]
        key = self._key_of(request) if before else None
        if key is not None:  # in the background: the caller has its program (runtime/write_behind.py)
            self._writes.submit(lambda: write_all(before, request, binary, key))

    def flush(self) -> None:
        """Wait until every hit so far is written through to the tiers above it."""
        self._writes.flush()

    def describe(self) -> list[SourceInfo]:
        """Each source below memory, in order, as it describes itself."""
        return [source.describe() for source in self.sources]

    def close(self) -> None:
        self._writes.close()  # before the tiers it writes to are closed
        for source in self.sources:
            source.close()
