"""``Handle.program``: a kernel program from the fastest source that has it.

Making a handle opens the device, digests every kernel source and opens the best system
bundle, so that a later hit reads no file but its bundle's pages (see :meth:`Handle.prepare_steps`).
A handle therefore sees the kernel sources as they were when it was made; make a new one to
pick up edits (a JIT compile always keys what it compiles by the source as it is then).

Resolution order, each step timed:
1. memory — programs this handle already loaded;
2. system — installed bundles that fit the device (exact ``<arch>_<cu>.kdb``, then
   ``<arch>.kdb``), keyed with the compiler each bundle records;
3. user — the per-user ``.ukdb`` (unless ``KDB_DISABLE_CACHE``), keyed with the local compiler;
4. jit — compile (unless ``KDB_DISABLE_JIT``) under a per-key lock, store in the user cache.
A binary that fails to decode or load is skipped with a warning and the next source is
tried: a wrong binary is never used. The environment is read when a handle is made.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

from kdbkit.kdb import Bundle, CorruptEntryError, KdbError
from kdbkit.runtime import env, kernel_sources, paths
from kdbkit.runtime.backends.base import Backend, BinaryLoadError, CompilerUnavailableError, DeviceInfo, Kernel, Module
from kdbkit.runtime.jit import build_once
from kdbkit.runtime.logging_setup import api_logging_enabled, get_logger, log_api_call, warn_once
from kdbkit.runtime.program_key import ProgramKey, normalise_options, program_key
from kdbkit.runtime.system_bundles import Candidate, SystemBundleSearch
from kdbkit.runtime.user_cache import UserCache

_log = get_logger("runtime.handle")
SOURCES = ("memory", "system", "user", "jit")


class JitDisabledError(KdbError):
    """A program is in no bundle or cache and ``KDB_DISABLE_JIT`` forbids compiling it."""


@dataclass
class Step:
    """One step of a resolution: what was tried, how long it took, what happened."""

    name: str
    ms: float
    outcome: str


@dataclass
class Program:
    """A loaded program and how it was found."""

    kernel_file: str
    options: tuple[str, ...]
    module: Module
    source: str  # one of SOURCES
    steps: list[Step] = field(default_factory=list)
    _functions: dict[str, Kernel] = field(default_factory=dict, repr=False)

    @property
    def total_ms(self) -> float:
        return sum(s.ms for s in self.steps)

    def function(self, name: str) -> Kernel:
        """The kernel ``name`` in this program (looked up once, then cached)."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self.module.function(name)
        return fn


class _Timer:
    def __init__(self, steps: list[Step], name: str):
        self.steps, self.name, self.outcome = steps, name, "miss"

    def __enter__(self) -> "_Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.steps.append(Step(self.name, (time.perf_counter() - self.t0) * 1e3, self.outcome))


class Handle:
    """Resolves and loads programs for one device.

    Args:
        device: the device to use; the default device (first GPU, else PoCL) if None.
        backend: an already opened backend (tests, or to share one); opened from
            ``device`` if None.
    """

    def __init__(self, device: DeviceInfo | None = None, *, backend: Backend | None = None):
        from kdbkit.runtime.backends.registry import default_device, open_backend

        if backend is None:
            backend = open_backend(device or default_device())
        self.backend = backend
        self.device = backend.device
        self.target = self.device.target
        self._arch = self.target.full_arch  # every key names it
        self.use_cache = not env.get_bool("KDB_DISABLE_CACHE")
        self.allow_jit = not env.get_bool("KDB_DISABLE_JIT")
        self._memory: dict[tuple[str, tuple[str, ...]], Program] = {}
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()
        self._system: SystemBundleSearch | None = None
        self._user: UserCache | None = None
        self._compiler: str | None = None
        self._compiler_error: str | None = None
        self.prepare_steps: list[Step] = self._prepare()

    def _prepare(self) -> list[Step]:
        """Work done once per handle instead of on a program's first lookup; each step timed.

        It sits next to the device open (about 260 ms for a CUDA context, measured), so the
        first program of a process costs about what a later one does.
        """
        steps: list[Step] = []
        with _Timer(steps, "digest kernel sources") as t:
            try:
                self._digests.update(kernel_sources.source_digests())
                t.outcome = f"{len(self._digests)} sources"
            except kernel_sources.KernelSourceError as exc:
                t.outcome = "failed"  # program() raises it again, for the file it is asked for
                _log.debug("kernel sources not digested: %s", exc)
        with _Timer(steps, "open system bundle") as t:
            first = self._system_search().get(0)
            t.outcome = first.path.name if first is not None else "none"
            if first is not None:
                first.warm_up()
        if first is None and self.use_cache:  # without a system bundle, the user cache serves first
            with _Timer(steps, "open user cache") as t:
                cache = self._user_cache()
                if cache is not None:
                    cache.warm_up()
                    t.outcome = "opened" if cache.is_open else "none yet"
                else:
                    t.outcome = "no compiler"
        return steps

    # -- lazily opened sources -----------------------------------------------------------

    def _system_search(self) -> SystemBundleSearch:
        with self._lock:
            if self._system is None:
                self._system = SystemBundleSearch(self.target, self.backend.binary_format, paths.iter_system_db_dirs())
            return self._system

    def _system_bundles(self) -> Iterator[Bundle]:
        """Accepted system bundles, best first, opened only as far as the caller iterates."""
        yield from self._system_search()
        if self._system.found_none:
            name = self.target.bundle_name()
            if warn_once(f"missing-system-db:{name}", f"Missing system database file: {name} Performance may degrade",
                         logger=_log):
                for c in self._system.trace:
                    if c.status == "rejected":
                        _log.warning("system bundle %s not used: %s", c.path, c.reason)

    @property
    def system_trace(self) -> list[Candidate]:
        """Every system bundle considered so far, accepted or rejected with the reason."""
        return self._system.trace if self._system is not None else []

    def compiler(self) -> str | None:
        """The local compiler's identity, or None (with the reason kept) if unavailable."""
        with self._lock:
            if self._compiler is None and self._compiler_error is None:
                try:
                    self._compiler = self.backend.compiler_identity()
                except CompilerUnavailableError as exc:
                    self._compiler_error = str(exc)
            return self._compiler

    def _user_cache(self) -> UserCache | None:
        if not self.use_cache:
            return None
        compiler = self.compiler()
        if compiler is None:
            return None  # entries are keyed by compiler: without one we cannot match them
        with self._lock:
            if self._user is None:
                self._user = UserCache(paths.user_cache_dir(), self.target, compiler=compiler,
                                       binary_format=self.backend.binary_format)
            return self._user

    def _source_digest(self, kernel_file: str) -> str:
        digest = self._digests.get(kernel_file)
        if digest is None:
            digest = self._digests[kernel_file] = kernel_sources.source_digest(kernel_file)
        return digest

    def _key(self, kernel_file: str, opts: tuple[str, ...], digest: str, compiler: str) -> ProgramKey:
        return program_key(kernel_file=kernel_file, options=opts, arch=self._arch, source_digest=digest,
                           compiler=compiler)

    # -- resolution ----------------------------------------------------------------------

    def program(self, kernel_file: str, options: str | Sequence[str] = ()) -> Program:
        """Resolve and load ``kernel_file`` compiled with ``options`` for this device.

        Args:
            kernel_file: a file in ``kernels/``, e.g. ``"activation.c"``.
            options: compile options, e.g. ``["-DTYPE=float", "-DTILE=16"]`` or one string.

        Returns:
            The loaded program; ``program.source`` says where it came from and
            ``program.steps`` how long each step took.

        Raises:
            OptionsError: contradictory options.
            JitDisabledError: no source has it and ``KDB_DISABLE_JIT`` is set.
            CompilerUnavailableError: no source has it and there is no compiler.
            CompileError: the compiler rejected the source.
        """
        opts = normalise_options(options)
        t0 = time.perf_counter()
        hit = self._memory.get((kernel_file, opts))
        steps = [Step("memory", (time.perf_counter() - t0) * 1e3, "miss" if hit is None else "hit")]
        if hit is not None:
            program = Program(kernel_file, opts, hit.module, "memory", steps, hit._functions)
        else:
            program = self._resolve(kernel_file, opts, steps)
            with self._lock:
                self._memory.setdefault((kernel_file, opts), program)
        if api_logging_enabled():
            log_api_call(f"resolve {kernel_file} [{' '.join(opts)}] on {self.target}: {program.source} in "
                         f"{program.total_ms:.3f} ms", logger=_log)
        return program

    def programs(self, requests: Iterable[tuple[str, str | Sequence[str]]]) -> list[Program]:
        """Resolve many programs, compiling up to ``KDB_COMPILE_PARALLEL_LEVEL`` at once."""
        requests = list(requests)
        workers = max(1, min(len(requests), env.get_int("KDB_COMPILE_PARALLEL_LEVEL") or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kdb-compile") as pool:
            return list(pool.map(lambda r: self.program(*r), requests))

    def _resolve(self, kernel_file: str, opts: tuple[str, ...], steps: list[Step]) -> Program:
        digest = self._source_digest(kernel_file)
        for bundle in self._system_bundles():
            key = self._key(kernel_file, opts, digest, bundle.metadata.compiler)
            with _Timer(steps, f"system {bundle.path.name}") as t:
                module = self._load_from(lambda: bundle.get(key.kernel_name, key.kernel_args), key, str(bundle.path), t)
            if module is not None:
                return Program(kernel_file, opts, module, "system", steps)

        cache = self._user_cache()
        compiler = self.compiler()
        key = None
        if compiler is not None:
            key = self._key(kernel_file, opts, digest, compiler)
        if cache is not None and key is not None:
            with _Timer(steps, "user") as t:
                module = self._load_from(lambda: cache.get(key), key, str(cache.path), t, discard=cache.discard)
            if module is not None:
                return Program(kernel_file, opts, module, "user", steps)
        return self._jit(kernel_file, opts, key, cache, steps)

    def _load_from(self, fetch, key: ProgramKey, where: str, timer: _Timer, discard=None) -> Module | None:
        """Fetch a binary and load it; any failure is a miss with a warning, never a crash.

        ``discard(key)`` removes an entry that does not load, so that it is rebuilt.
        """
        try:
            binary = fetch()
        except CorruptEntryError as exc:
            warn_once(f"corrupt:{where}:{key}", f"{exc}; skipping it", logger=_log)
            timer.outcome = "corrupt"
            return None
        except KdbError as exc:  # the file itself is damaged where this lookup reads it
            warn_once(f"damaged:{where}", f"{exc}; looking elsewhere", logger=_log)
            timer.outcome = "damaged"
            return None
        if binary is None:
            return None
        try:
            module = self.backend.load(binary)
        except BinaryLoadError as exc:
            warn_once(f"unloadable:{where}:{key}", f"{where}: {key} does not load on {self.device.name}: {exc}; "
                      "skipping it", logger=_log)
            timer.outcome = "unloadable"
            if discard is not None:
                discard(key)
            return None
        timer.outcome = "hit"
        return module

    def _jit(self, kernel_file: str, opts: tuple[str, ...], key: ProgramKey | None, cache: UserCache | None,
             steps: list[Step]) -> Program:
        searched = ", ".join(str(c.path) for c in self.system_trace if c.status == "accepted") or "no system bundle"
        if not self.allow_jit:
            raise JitDisabledError(
                f"no program {kernel_file} [{' '.join(opts)}] for {self.target.full_arch} in {searched}"
                f"{' or the user cache' if cache else ''}; build it with `kdb build --target {self.target}` "
                f"(bundle {self.target.bundle_name()}) or unset KDB_DISABLE_JIT")
        if key is None:
            raise CompilerUnavailableError(
                f"no program {kernel_file} [{' '.join(opts)}] for {self.target.full_arch} in {searched}, and no "
                f"compiler to build it: {self._compiler_error}")
        source = kernel_sources.read_source(kernel_file)
        # Key what is compiled by the source as it is now, not as the handle first saw it, so
        # that an edit made since never lands in the cache under the old source's key.
        digest = kernel_sources.source_digest(kernel_file)
        if digest != self._digests.get(kernel_file):
            self._digests[kernel_file] = digest
            key = self._key(kernel_file, opts, digest, self.compiler())
        include_dirs = [kernel_sources.kernels_dir()]
        lock_dir = cache.lock_dir if cache is not None and cache.usable else None
        with _Timer(steps, "jit") as t:
            binary, origin = build_once(key, cache, lock_dir, lambda: self.backend.compile(
                source, name=kernel_file, options=list(opts), include_dirs=include_dirs))
            t.outcome = "compiled" if origin == "jit" else "built by another process"
        with _Timer(steps, "load") as t:
            module = self.backend.load(binary)
            t.outcome = "loaded"
        return Program(kernel_file, opts, module, origin, steps)

    def close(self) -> None:
        """Close the bundles and the user cache this handle opened."""
        with self._lock:
            if self._system is not None:
                self._system.close()
            self._system = None
            if self._user is not None:
                self._user.close()
