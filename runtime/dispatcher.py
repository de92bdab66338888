"""The dispatcher: one per handle, it owns what a primitive call needs besides the programs.

A call goes problem -> choice (the solver asked for, else the find-db's best, else the
heuristic: ``kdbkit.runtime.immediate``) -> the solver's :class:`~kdbkit.runtime.solver.Solution`
(its program requests and invoker factory) -> programs resolved -> invoker. The dispatcher
keeps one cache per concern, each keyed from the problem's config string: the choice per
config string, the invoker per (config string, solver id), and the repeat-call plans
(``kdbkit.runtime.primitives.repeat``) per call signature, which names the same problem. It
opens the find-db on first use. Nothing else holds any of these.

A problem's ranking is read from the user find-db, then the cluster's shared rankings
(:mod:`kdbkit.runtime.shared_rankings`, where the chain has a cluster tier: found on this
cluster's own devices, and written through to the user find-db), then the system find-dbs
shipped with the bundles. What find ranks goes to the user find-db and to the cluster.

Programs are resolved through a resolver, ``request -> Program | None``: the handle's full
lookup chain for the caller; the prefetch worker passes one that reads its system bundle only,
and a program that bundle lacks leaves that problem to the caller (nothing is cached for it).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterator

from kdbkit.kdb.find_db import FindDb
from kdbkit.kdb.version import __version__
from kdbkit.runtime import immediate, paths
from kdbkit.runtime.errors import NoSolverError
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.solver import REGISTRY, Context, Invoker, Solver

if TYPE_CHECKING:
    from kdbkit.kdb.find_db import FindRecord
    from kdbkit.runtime.backends.base import Backend
    from kdbkit.runtime.immediate import Choice
    from kdbkit.runtime.problem import Problem
    from kdbkit.runtime.program import Program
    from kdbkit.runtime.program_key import ProgramRequest
    from kdbkit.runtime.redis_tier import RedisTier
    from kdbkit.runtime.shared_rankings import SharedRankings

_log = get_logger(__name__)
Resolver = Callable[["ProgramRequest"], "Program | None"]


class _Unresolved(Exception):
    """A resolver had no program for a request (the prefetch worker's, a bundle lacking it):
    the problem is left to the caller, whose chain finds or compiles it."""


class Dispatcher:
    """Choices, invokers, repeat-call plans and the find-db of one device.

    ``choices`` (config string -> :class:`~kdbkit.runtime.immediate.Choice`) and ``invokers``
    ((config string, solver id) -> invoker) are read-only views of its caches; ``plans`` is
    written by :func:`kdbkit.runtime.primitives.repeat.repeatable` alone.

    Args:
        backend: the backend invokers launch on (its ``device`` is the device).
        resolve: the caller's resolver (the handle's lookup chain); it raises, never returns
            None, for a program it cannot provide.
        asked: told each config string immediate mode chooses for (the handle notes it for
            the next process's prefetch, and waits for the worker if it is on that problem).
        find_db: the find-db to read and write; by default the device's, opened on first use
            (system files beside the bundles, the user file under ``KDB_USER_DB_PATH``).
        cluster: the chain's cluster tier (a :class:`~kdbkit.runtime.redis_tier.RedisTier`),
            whose connection shares rankings across the cluster; None: rankings stay local.
    """

    def __init__(self, backend: "Backend", resolve: Resolver, *, asked: Callable[[str], None] | None = None,
                 find_db: FindDb | None = None, cluster: "RedisTier | None" = None):
        self.backend = backend
        self.device = backend.device
        self._resolve = resolve
        self._asked = asked
        self._choices: dict[str, Choice] = {}
        self._invokers: dict[tuple[str, int], Invoker] = {}
        self._contexts: dict[tuple[str, int], Context] = {}  # each invoker's, holding its workspace
        self.plans: dict[tuple, object] = {}  # repeat calls' plans by call signature (primitives/repeat.py)
        self.choices = MappingProxyType(self._choices)  # read-only views, for tools and tests
        self.invokers = MappingProxyType(self._invokers)
        self._find_db = find_db
        self._find_db_lock = threading.Lock()
        self.shared: SharedRankings | None = None  # the cluster's rankings, where the chain has a cluster tier
        if cluster is not None:  # imported only with a cluster: a process without one never loads it
            from kdbkit.runtime.shared_rankings import SharedRankings

            self.shared = SharedRankings(cluster, _find_db_target(self.device))

    @property
    def find_db(self) -> FindDb:
        """The find-db, made on first use, once: the prefetch worker and the caller may both ask first."""
        db = self._find_db
        if db is None:
            with self._find_db_lock:
                if self._find_db is None:
                    self._find_db = FindDb(
                        _find_db_target(self.device),
                        [d.path for d in paths.iter_system_db_dirs() if not d.is_file], _user_db_dir(self.device),
                        producer=f"kdbkit {__version__}",
                        warn=lambda key, message: warn_once(key, message, logger=_log))
                db = self._find_db
        return db

    def choose(self, problem: "Problem", solver: int | str | None = None) -> "Choice":
        """The solver for ``problem``: the one asked for, else the find-db's best, else the
        heuristic's (:mod:`kdbkit.runtime.immediate`); kept per config string.

        Raises:
            NoSolverError: the solver asked for does not exist, is for another primitive or
                does not apply; or none applies (the message lists each solver's reason).
        """
        if solver is not None:
            return immediate.asked(problem, self.device, solver)
        config = problem.config()
        if self._asked is not None:
            self._asked(config)  # the prefetch worker may be choosing it now
        cached = self._choices.get(config)
        if cached is None:
            cached = self._choices[config] = immediate.heuristic(problem, self.device, self.ranked(problem))
        return cached

    def ranked(self, problem: "Problem") -> Iterator[tuple["FindRecord", Solver, str]]:
        """The find-db's ranking for ``problem``, best first, as (record, solver, where)
        (:func:`kdbkit.runtime.immediate.ranked`, which skips the solvers this kdbkit lacks
        or that do not apply, wherever the ranking came from)."""
        return immediate.ranked(self.ranking(problem), problem, self.device)

    def ranking(self, problem: "Problem") -> "tuple[list[FindRecord], str] | None":
        """``problem``'s ranking and where it came from (``user``, ``cluster`` or a system
        find-db's path), or None. The cluster's comes before the system files' (it was timed on
        this cluster's devices) and is written through to the user find-db, so it is fetched
        once per node."""
        db, config = self.find_db, problem.config()
        found = db.load_user(config)
        if found is None and self.shared is not None:
            records = self.shared.load(problem)
            if records:
                db.store(config, records)
                found = records, "cluster"
        return found or db.load_system(config)

    def record(self, problem: "Problem", records: "list[FindRecord]", *, share: bool = True) -> None:
        """Keep the ranking find just made: in the user find-db and, with ``share``, on the
        cluster (where this process may write); the choice kept for it is forgotten."""
        config = problem.config()
        self.find_db.store(config, records)
        if share and self.shared is not None:
            self.shared.publish(problem, records)
        self.forget(config)

    def invoker(self, problem: "Problem", solver: Solver | int | str | None = None, *,
                resolver: Resolver | None = None) -> Invoker:
        """The invoker of ``solver`` (immediate mode's choice if None) for ``problem``, made once
        per (config string, solver id): its solution's programs resolved by ``resolver``
        (the caller's chain if None), then its factory called.

        Raises:
            NoSolverError: as :meth:`choose`, or ``solver`` names no solver.
            KdbError: a program could not be resolved (as ``Handle.program``).
        """
        if solver is None:
            solver = self.choose(problem).solver
        elif not isinstance(solver, Solver):
            found = REGISTRY.find(solver)
            if found is None:
                raise NoSolverError(f"no solver {solver!r}", "name a registered solver by its id or name")
            solver = found
        key = (problem.config(), solver.id)
        cached = self._invokers.get(key)
        if cached is None:
            cached, context = self._make(problem, solver, resolver or self._resolve)
            self._invokers[key], self._contexts[key] = cached, context
        return cached

    def workspace_buffers(self) -> list:
        """The device buffers the kept invokers hold as workspace (freed by :meth:`close`)."""
        return [b for context in list(self._contexts.values()) for b in context.owned]

    @contextmanager
    def scratch_invoker(self, problem: "Problem", solver: Solver) -> Iterator[Invoker]:
        """An invoker of ``solver`` for ``problem`` made now and not kept: the workspace it
        allocates is freed when the block ends (after a synchronising call: find's timing), so
        that find over many problems holds no more memory than one invoker's. Invokers it makes
        for other problems (a convolution's GEMM) are kept as any other."""
        run, context = self._make(problem, solver, self._resolve)
        try:
            yield run
        finally:
            _free(context)

    def _make(self, problem: "Problem", solver: Solver, resolver: Resolver) -> tuple[Invoker, Context]:
        solution = solver.solution(problem, self.device)
        programs = []
        for request in solution.programs:
            program = resolver(request)
            if program is None:
                raise _Unresolved(f"{request} not resolved for {solver.name}: left to the caller")
            programs.append(program)
        context = Context(self.backend, self.device, self, resolver)
        try:
            return solution.invoker_factory(programs, context), context
        except BaseException:
            _free(context)  # what the factory allocated before it failed
            raise

    def forget(self, config: str) -> None:
        """Drop the choice kept for ``config`` (find just ranked it anew: the next call reads
        the new ranking), and the repeat-call plans, which keep the invoker of the old choice
        (a plan's key is a call signature, not a config string: all go, to be made again on
        the next call of each). Its invokers stay: they do not depend on the ranking."""
        self._choices.pop(config, None)
        self.plans.clear()

    def close(self) -> None:
        """Close the find-db if it was opened, and free the invokers' workspaces (the handle
        refuses calls from now on, and the repeat-call plans that keep invokers go)."""
        if self._find_db is not None:
            self._find_db.close()
        self.plans.clear()
        self._invokers.clear()
        for context in self._contexts.values():
            _free(context)
        self._contexts.clear()


def _free(context: Context) -> None:
    """Free the buffers an invoker's factory and calls allocated (the backend's own errors
    warned about, never raised: the memory goes with the process anyway)."""
    while context.owned:
        buffer = context.owned.pop()
        try:
            buffer.free()
        except Exception as e:
            warn_once(f"free:{type(e).__name__}", f"an invoker's workspace could not be freed "
                      f"({type(e).__name__}: {e}); it stays allocated until the process ends", logger=_log)


def _find_db_target(device) -> str:
    """The exact target the find-db's files are named for (``sm_90_132``): rankings are per device."""
    return Path(device.target.bundle_name()).stem


def _user_db_dir(device) -> Path | None:
    """The user find-db's folder, or None (with one warning) when it or the device's file in it
    is another user's or writable by others: a planted find-db chooses the solvers this process
    runs, so it is ignored, and find results are not saved."""
    from kdbkit.kdb.find_db import USER_SUFFIX
    from kdbkit.runtime import private_folder

    folder = paths.user_db_dir()
    file = folder / (Path(device.target.bundle_name()).stem + USER_SUFFIX)
    for path in (folder, file):
        why = private_folder.untrusted(path)
        if why:
            warn_once(f"unsafe-folder:{path}", f"Not using the user find-db in {folder}: {why}. Solvers are chosen "
                      "without it and find results are not saved; or set KDB_USER_DB_PATH to a folder of yours.",
                      logger=_log)
            return None
    return folder
