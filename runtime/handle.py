"""``Handle``: the entry point for one device: its lookup chain and its kernel search path.

Making a handle opens the device and the best system bundle, and digests the kernel sources
that bundle was built from (its manifest), so that a later hit reads no file but its bundle's
pages (see :attr:`Handle.prepare_steps`); other sources are digested on first use. It then
starts a worker thread that loads the programs that bundle served the last handle closed with
the same user cache folder, and sets up the problems that handle ran (``kdbkit.runtime.prefetch``). A handle
therefore sees each kernel source as it was when it first digested it; make a new one to pick
up edits (a JIT compile always keys what it compiles by the source as it is then).

Its :attr:`Handle.dispatcher` (``kdbkit.runtime.dispatcher``) chooses solvers, makes and keeps
their invokers and repeat-call plans, and holds the find-db; where the chain has a cluster tier,
it shares find-db rankings on that tier's connection (``kdbkit.runtime.shared_rankings``).

The chain (``kdbkit.runtime.lookup``): memory, then the tiers ``sources`` names, else
``KDB_CACHE_SOURCES``, else the default: system bundles (exact ``<arch>_<cu>.kdb``, then
``<arch>.kdb``), the user cache (unless ``KDB_DISABLE_CACHE``), the JIT (unless
``KDB_DISABLE_JIT``), which writes what it compiles into every writable tier
(``kdbkit.runtime.cache_sources``). The environment is read when a handle is made.

Example::

    with Handle() as handle:                      # the first GPU, else PoCL on the CPU
        program = handle.program("activation.c", ["-DKDB_DTYPE=float"])
        relu = program.function("relu_fwd")
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Sequence

from kdbkit.kdb.find_db import FindDb
from kdbkit.runtime import cache_policy, cache_sources, env, kernel_sources, preflight, prefetch, startup_memo, tier_stats
from kdbkit.runtime.backends.base import Backend, DeviceInfo
from kdbkit.runtime.compilers import Compiler, LazyCompiler
from kdbkit.runtime.dispatcher import Dispatcher
from kdbkit.runtime.errors import JitDisabledError  # noqa: F401 - re-exported for callers of program()
from kdbkit.runtime.errors import HandleClosedError, ProblemError
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.logging_setup import api_logging_enabled, get_logger, log_api_call, warn_once
from kdbkit.runtime.lookup import Keys, LookupChain, SystemBundleSource, UserCacheSource
from kdbkit.runtime.program import Program, Step, Steps
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.system_bundles import Candidate
from kdbkit.runtime.tier import Source, SourceInfo, TierContext

_log = get_logger(__name__)


class Handle:
    """Resolves and loads programs for one device. A context manager.

    Args:
        device: the device to use: its index in ``kdb devices``' list, a :class:`DeviceInfo`,
            or None for the default device (first GPU, else PoCL).
        backend: an already opened backend (to share one); the caller keeps closing it.
            Opened from ``device`` if None, and then closed with the handle.
        kernel_path: folders of kernel sources searched before ``KDB_KERNEL_PATH`` and
            kdbkit's own (a library's kernels).
        compiler: the compiler for the user cache and the JIT; by default the one
            :func:`kdbkit.runtime.compilers.compiler_for` picks for the device.
        sources: the lookup chain's tiers below memory, in order; each a built-in name
            (``"system"``, ``"user"``, ``"jit"``), ``"module:Class"`` (a
            :class:`~kdbkit.runtime.tier.Source` subclass made with no arguments) or a Source
            instance (e.g. a :class:`~kdbkit.runtime.keyed_tier.KeyedTier`), the one that compiles
            (``"jit"``) last. None: ``KDB_CACHE_SOURCES`` (the same entries, comma-separated; a
            bad value warns once and the default applies), else ``("system", "user", "jit")``.
            Either way, ``KDB_CACHE_POLICY``, ``KDB_DISABLE_CACHE`` and ``KDB_DISABLE_JIT`` may
            leave ``"user"`` out or unwritten and forbid compiling. What the JIT compiles is put
            into every writable tier; a tier's :meth:`~kdbkit.runtime.tier.Source.lease` is held
            around each compile. A Source
            instance serves this handle alone (it keys with the handle's context) and is closed
            with it.

    Raises:
        BackendUnavailableError: no device, none at that index, or its vendor library is missing.
        CacheSourcesError: ``sources`` cannot be made into a chain (an unknown name, a tier
            after the JIT, a name twice, an instance that serves another handle).
    """

    closed: bool = False  # set by close(); a closed handle refuses work (HandleClosedError)

    def __init__(self, device: int | DeviceInfo | None = None, *, backend: Backend | None = None,
                 kernel_path: Iterable[str | Path] = (), compiler: Compiler | None = None,
                 sources: Sequence[str | Source] | None = None):
        from kdbkit.runtime.backends.registry import open_backend, pick_device

        self._owns_backend = backend is None
        if backend is None and env.get_str("KDB_REMOTE_CACHE"):
            from kdbkit.runtime.redis_link import preload

            preload()  # the redis client's import, beside the device's opening rather than after it
        if backend is None:
            backend = open_backend(pick_device(device))
        self.backend = backend
        self.device = backend.device
        self.target = self.device.target
        self.search_path = KernelSearchPath(kernel_path)
        self.compiler = LazyCompiler(self.target, compiler)
        policy = cache_policy.current()
        self.use_cache = policy.read_user
        self._keys = Keys(self.target, self.search_path)
        context = TierContext(self.target, backend.binary_format, self._keys, self.compiler,
                              preflight.runtime_of(self.device.backend, self.device.runtime))
        try:
            tiers = cache_sources.assemble(sources, context, policy)
        except BaseException:
            if self._owns_backend:
                backend.close()
            raise
        # The tiers the handle itself works with: the system bundle it opens and prefetches from,
        # and the user cache it reports and opens first when there is no bundle; None if absent.
        self._system = next((t for t in tiers if isinstance(t, SystemBundleSource)), None)
        self._user = next((t for t in tiers if isinstance(t, UserCacheSource)), None)
        self.chain = LookupChain(tiers, backend.load, self.device.name, key_of=context.key)
        if self._user is not None and self._user.writable:  # kdb cache stats keeps its counts beside the cache
            tier_stats.save_at_exit(self._user.folder)
        self.dispatcher = Dispatcher(backend, self._resolve, asked=self.problem_asked,  # choices, invokers, plans
                                     cluster=_cluster_tier(tiers))
        self._asked: dict[ProgramRequest, None] = {}  # every request, in first-asked order
        self._problems: dict[str, None] = {}  # config strings run in immediate mode, in first-asked order
        self._prefetch_key: str | None = None  # the system bundle whose programs the memo lists
        self._prefetch: prefetch.Prefetch | None = None
        self.prepare_steps: list[Step] = self._prepare()
        if _log.isEnabledFor(logging.INFO):
            _log.info("handle for %s (%s): %s", self.device.name, self.target,
                      ", ".join(f"{s.name} {s.outcome}" for s in self.prepare_steps))

    def _prepare(self) -> list[Step]:
        """Work done once per handle instead of on a program's first lookup; each step timed.

        It sits next to the device open (a CUDA context's creation dwarfs it), so the first
        program of a process costs about what a later one does.
        """
        steps = Steps()
        first = None
        if self._system is not None:
            with steps.time("open system bundle") as t:
                first = self._system.search.get(0)
                t.outcome = first.path.name if first is not None else "none"
                if first is not None:
                    first.warm_up()
                else:
                    self._system.warn_missing()  # here, not on the first program, which it would slow
        if first is not None and first.metadata.sources:
            with steps.time("digest kernel sources") as t:
                t.outcome = self._digest_manifest(first)
        if first is not None and self.use_cache:
            self._prefetch_key = str(first.path)
            if not env.get_bool("KDB_DISABLE_PREFETCH"):
                memo = startup_memo.memo()
                programs = prefetch.remembered(memo.section(prefetch.SECTION).get(self._prefetch_key))
                problems = prefetch.remembered_problems(memo.section(prefetch.PROBLEMS_SECTION).get(self._prefetch_key))
                if programs or problems:  # runtime/prefetch.py: done while the caller sets up and calls
                    with steps.time("start prefetch") as t:
                        self._prefetch = prefetch.Prefetch(self._prefetch_one, [*programs, *problems])
                        t.outcome = f"{len(programs)} programs, {len(problems)} problems"
        if first is None and self._user is not None:  # without a system bundle, the user cache serves first
            with steps.time("open user cache") as t:
                cache = self._user.cache
                if cache is not None:
                    cache.warm_up()
                    t.outcome = "opened" if cache.is_open else "none yet"
                else:
                    t.outcome = "no compiler"
        startup_memo.memo().save()  # what this handle learnt about files, for the next process
        return list(steps)

    def _digest_manifest(self, bundle) -> str:
        """Digest the kernel files ``bundle`` was built from (its manifest), and only those:
        its hits then read no source, and a handle costs the same however many kernel files
        the search path holds (the others are digested on first use). A file whose source
        differs from the bundle's is reported once: its programs will not hit the bundle."""
        manifest = bundle.metadata.source_digests
        stale = []
        for name, digest in self.search_path.digest_each(manifest).items():
            if isinstance(digest, kernel_sources.KernelSourceError):
                _log.info2("kernel source %s not digested: %s", name, digest)  # program() raises it for that file
                continue
            self._keys.set_digest(name, digest)
            if digest != manifest[name]:
                stale.append(name)
        if stale:
            listed = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
            warn_once(f"stale-sources:{bundle.path}",
                      f"{bundle.path.name} was built from other versions of {len(stale)} kernel source(s) "
                      f"({listed}): their programs will compile instead of loading from it. Install the "
                      "bundle built for this kdbkit, or rebuild it (`kdb build`).", logger=_log)
        return f"{len(manifest)} sources" + (f", {len(stale)} differ from the bundle's" if stale else "")

    @property
    def resolved_by_source(self) -> dict[str, int]:
        """How many programs each tier served this handle ("system", "user", "jit"); memory hits
        are not counted."""
        return dict(self.chain.resolved)

    @property
    def sources(self) -> tuple[Source, ...]:
        """The chain's tiers below memory, in the order they are asked."""
        return tuple(self.chain.sources)

    def describe_sources(self) -> list[SourceInfo]:
        """Each tier below memory as it describes itself: name, where it looks, writable or not."""
        return self.chain.describe()

    @property
    def system_trace(self) -> list[Candidate]:
        """Every system bundle considered so far, accepted or rejected with the reason."""
        return self._system.search.trace if self._system is not None else []

    @property
    def user_cache_path(self) -> Path | None:
        """The user cache file this handle reads and writes, or None (disabled, or no compiler)."""
        cache = self._user.cache if self._user is not None else None
        return cache.path if cache is not None else None

    def program(self, kernel_file: str, options: str | Sequence[str] = ()) -> Program:
        """Resolve and load ``kernel_file`` compiled with ``options`` for this device.

        Args:
            kernel_file: a name on the kernel search path, e.g. ``"activation.c"``.
            options: compile options, e.g. ``["-DTYPE=float", "-DTILE=16"]`` or one string.

        Returns:
            The loaded program; ``program.source`` says which tier answered and
            ``program.steps`` how long each step took.

        Raises:
            OptionsError: malformed or contradictory options.
            KernelSourceError: no such kernel file on the search path.
            JitDisabledError: no tier has it and ``KDB_DISABLE_JIT`` is set.
            CompilerUnavailableError: no tier has it and there is no compiler.
            CompileError: the compiler rejected the source.
            HandleClosedError: the handle is closed.
        """
        if self.closed:
            raise HandleClosedError()
        request = ProgramRequest(kernel_file, options)
        if request not in self._asked:
            self._asked[request] = None
            if self._prefetch is not None:
                self._prefetch.wait(request)
        program = self.chain.resolve(request)
        if api_logging_enabled():
            log_api_call(f"resolve {request} on {self.target}: {program.source} in {program.total_ms:.3f} ms",
                         logger=_log)
        return program

    def _resolve(self, request: ProgramRequest) -> Program:
        """The dispatcher's resolver for the caller's solvers: :meth:`program`."""
        return self.program(request.kernel_file, request.options)

    def _prefetch_one(self, item: ProgramRequest | str) -> None:
        """The prefetch worker's work: load a program from the system bundle, or set up a
        problem (its config string) as its first call would: the solver chosen and its invoker
        made by the dispatcher, with programs from memory or that bundle only (never compiled
        here: a program the bundle lacks leaves the problem to the caller)."""
        if isinstance(item, ProgramRequest):
            self.chain.preload(item, self._system)
            return
        from kdbkit.runtime.problem import parse_config

        self.dispatcher.invoker(parse_config(item), resolver=self._from_bundle)

    def _from_bundle(self, request: ProgramRequest) -> Program | None:
        """The prefetch worker's resolver: memory or the system bundle, else None."""
        return self.chain.preload(request, self._system)

    def problem_asked(self, config: str) -> None:
        """Immediate mode runs ``config``: note it for the next handle (the caller's problems
        only, not the worker's), and the first time, wait for the prefetch worker if it is
        setting that problem up now."""
        if config in self._problems or (self._prefetch is not None and self._prefetch.on_worker):
            return
        self._problems[config] = None
        if self._prefetch is not None:
            self._prefetch.wait(config)

    def _remember_programs(self) -> None:
        """Note, for the next handle's prefetch, the programs this one's system bundle served
        and the problems it ran in immediate mode."""
        if self._prefetch_key is None:
            return
        served = [r for r in self._asked if (p := self.chain.memory.get(r)) is not None and p.source == "system"]
        memo = startup_memo.memo()
        if served:
            memo.put(prefetch.SECTION, self._prefetch_key, prefetch.to_memo(served))
        if self._problems:
            memo.put(prefetch.PROBLEMS_SECTION, self._prefetch_key, list(self._problems)[:prefetch.MAX_PROBLEMS])

    def programs(self, requests: Iterable[tuple[str, str | Sequence[str]]]) -> list[Program]:
        """Resolve many programs, compiling up to ``KDB_COMPILE_PARALLEL_LEVEL`` at once."""
        requests = list(requests)
        workers = max(1, min(len(requests), env.get_int("KDB_COMPILE_PARALLEL_LEVEL") or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kdb-compile") as pool:
            return list(pool.map(lambda r: self.program(*r), requests))

    def kernel_folder(self, kernel_file: str) -> Path:
        """The search-path folder ``kernel_file`` comes from (``kdb resolve`` shows it)."""
        return self.search_path.find(kernel_file)

    def set_stream(self, stream: Any) -> None:
        """Launch this handle's primitives on ``stream`` (MIOpen's miopenSetStream): a CUDA stream
        handle, a ``torch.cuda.Stream`` or a ``cupy.cuda.Stream``; ``0`` or ``None`` for the default.

        Raises:
            ProblemError: the backend has no streams (OpenCL, HIP here), or ``stream`` is not one.
        """
        if "streams" not in self.backend.capabilities:
            raise ProblemError(f"the {self.backend.name} backend takes no stream",
                               "streams are for CUDA devices; leave it unset")
        raw = getattr(stream, "cuda_stream", getattr(stream, "ptr", stream))  # torch, cupy, or a handle
        try:
            self.backend.stream = int(raw or 0)
        except (TypeError, ValueError):
            raise ProblemError(f"{stream!r} is not a CUDA stream", "pass a stream handle, torch's or CuPy's") from None

    @property
    def find_db(self) -> FindDb:
        """This device's find-db (its dispatcher's): system files beside the bundles, the user
        file under KDB_USER_DB_PATH."""
        return self.dispatcher.find_db

    def close(self) -> None:
        """Close the bundles, the user cache and the find-db, and the backend if this handle opened it."""
        if self._prefetch is not None:
            self._prefetch.close()  # before the bundle and the device it loads from are closed
        self.dispatcher.close()
        self._remember_programs()
        self.chain.close()
        if self._user is not None and self._user.writable:
            tier_stats.save(self._user.folder)
        startup_memo.memo().save()  # files digested since the handle was made, programs it used
        if self._owns_backend:
            self.backend.close()
        self.closed = True
        self.dispatcher.plans.clear()  # a repeat call then takes the full path, which refuses a closed handle

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cluster_tier(tiers: Sequence[Source]):
    """The chain's cluster tier (the built-in ``remote``), whose connection the dispatcher also
    shares find-db rankings on, so that one outage is one warning; None without one (then
    nothing of the cluster's is imported)."""
    remote = next((t for t in tiers if t.name == "remote"), None)
    if remote is None:
        return None
    from kdbkit.runtime.redis_tier import RedisTier

    return remote if isinstance(remote, RedisTier) else None
