"""The offline build: the programs of a catalogue compiled for each target into bundles, in
parallel processes, incrementally, optionally one deterministic shard of the work.

The plan: each target's backend gives its programs (:func:`~kdbkit.packager.catalogue.programs_for`);
a program that does not depend on the compute-unit count (today every one: the counts are
launch arguments) goes once into the arch-wide ``<arch>.kdb``, which the runtime takes for any
device of the arch; an ``<arch>_<cu>.kdb`` would hold only programs compiled for one count.
Each program is keyed with :func:`program_key` exactly as the runtime looks it up.

Incremental: programs whose key the existing output bundle already holds (same target, same
compiler identity: the key carries the source digest) are not compiled again, and an
unchanged rebuild writes nothing. A failed compile is reported with the compiler's log; the
other programs are still written, and the result says so (the CLI exits 1).

Where the compiles run is a :class:`concurrent.futures.Executor`: by default a local process
pool (or this process, for one worker or an OpenCL target), or one the caller gives, such as
a Dask cluster's (:mod:`kdbkit.packager.cluster`). Each call carries everything a worker
needs (the compiler, the job, the kernel source read here once), so a worker needs only
kdbkit and the compiler; the keys are made here, by :func:`plan`, and each call first checks
that its worker's kdbkit and compiler are the ones the keys were made with.

The workers also compress what they compile (zstd level 19, no dictionary), so writing a
bundle is only inserting rows: writing at level 19 in this process after the compiles capped a
16-way build's speed-up near 6x (scripts/bench_build.py). A trained dictionary is not used:
it made bundles 3.5% smaller and needs every binary before the first can be compressed
(``kdb db merge`` still trains one where it pays).
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kdbkit.kdb import Target
from kdbkit.kdb.codec import StoredBlob, encode_for_bundle
from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.writer import write_stored_bundle
from kdbkit.kdb.version import __version__
from kdbkit.packager.catalogue import programs_for
from kdbkit.packager.device_build import refuse_failing_code_object
from kdbkit.packager.targets import builder_of
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.compilers import Compiler
from kdbkit.runtime.errors import CompileError, TargetError
from kdbkit.runtime.kernel_sources import KernelSearchPath, KernelSource
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.program_key import ProgramRequest, program_key


@dataclass(frozen=True)
class Job:
    """One program to compile for one bundle."""

    bundle: Target  # the bundle it goes to (arch-wide unless the program depends on the count)
    request: ProgramRequest
    kernel_name: str
    kernel_args: str
    source_digest: str = ""  # of its kernel file, as keyed: the bundle's source manifest lists it


@dataclass
class Failure:
    job: Job
    message: str
    log: str = ""


@dataclass
class BuildResult:
    """Per bundle written or left as it was; counts; failures with their logs."""

    bundles: dict[str, Path] = field(default_factory=dict)
    compiled: int = 0
    reused: int = 0
    failures: list[Failure] = field(default_factory=list)


def depends_on_count(request: ProgramRequest) -> bool:
    """Whether a program is compiled for one compute-unit count (an option naming it)."""
    return any(option.startswith("-DKDB_CU") for option in request.options)


def plan(targets: Sequence[Target], problems: Sequence[Problem] | None = None, *,
         requests: Sequence[ProgramRequest] | None = None,
         search_path: KernelSearchPath | None = None) -> tuple[list[Job], dict[Target, Compiler]]:
    """Every (bundle, program) the targets need, each once, in a fixed order; and each bundle's compiler.

    Args:
        targets: from :func:`~kdbkit.packager.targets.resolve_targets`.
        problems: the catalogue's problems (their solvers' programs per backend), or
        requests: the programs themselves, for every target (neither: ``--all``, every program
            each target's backend builds).
    """
    from kdbkit.runtime.primitives.catalogue import all_programs

    search_path = search_path or KernelSearchPath()
    digests: dict[str, str] = {}  # each kernel file read once, whatever the targets
    jobs: dict[tuple, Job] = {}
    compilers: dict[Target, Compiler] = {}
    for target in targets:
        compiler = builder_of(target)
        identity = compiler.identity()
        wanted = requests if requests is not None else (
            programs_for(problems, target.backend, target) if problems is not None
            else all_programs(target.backend, target))
        for request in wanted:
            bundle = target if depends_on_count(request) else target.arch_wide()
            compilers.setdefault(bundle, compiler)
            if request.kernel_file not in digests:
                digests[request.kernel_file] = search_path.read(request.kernel_file).digest
            key = program_key(request, target=bundle, compiler=identity, source_digest=digests[request.kernel_file])
            jobs.setdefault((str(bundle), key.kernel_name, key.kernel_args),
                            Job(bundle, request, key.kernel_name, key.kernel_args, digests[request.kernel_file]))
    return [jobs[k] for k in sorted(jobs)], compilers


def shard(jobs: Sequence[Job], index: int, count: int) -> list[Job]:
    """The ``index``-th of ``count`` slices (0-based): every count-th job of the fixed order,
    so that the slices of any job runner together hold each job exactly once."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: the index must be at least 0 and below the count")
    return [job for i, job in enumerate(jobs) if i % count == index]


def builder_identity(compiler: Compiler) -> str:
    """kdbkit's version and the compiler's identity: what a worker must have to compile for
    this machine's keys (the key holds the compiler's identity; kdbkit gives the options)."""
    return f"kdbkit {__version__}, {compiler.identity()}"


def _compile(compiler: Compiler, job: Job, source: KernelSource,
             expected: str | None = None) -> tuple[StoredBlob | None, str, str]:
    """(the binary as the bundle stores it, error message, log) of one job; runs in a worker
    process, maybe on another machine. The worker compresses too (zstd level 19), so that
    writing the bundles afterwards is only inserts and does not serialise the build.

    ``expected`` is :func:`builder_identity` where the keys were made: a worker whose kdbkit or
    compiler differs refuses the job rather than store a binary under another compiler's key.
    """
    try:
        if expected is not None and (here := builder_identity(compiler)) != expected:
            return None, f"{socket.gethostname()} has {here}, not {expected} (the keys' compiler)", ""
        binary = compiler.compile(job.request, job.bundle, source)
        if compiler.binary_format == "hsaco":
            refuse_failing_code_object(binary, job.request, job.bundle)
        return encode_for_bundle(binary), "", ""
    except CompileError as exc:
        return None, exc.problem, getattr(exc, "log", "") or ""
    except KdbError as exc:
        return None, exc.problem, ""


def refuse_local_only(targets: Iterable[Target], where: str = "on a cluster") -> None:
    """Refuse OpenCL targets for a build elsewhere than this process.

    Raises:
        TargetError: an OpenCL target: its compiler is a device of this process, and its
            binaries are tied to this machine's OpenCL driver and CPU.
    """
    for target in targets:
        if spec_for(target.backend).machine_local:
            raise TargetError(f"{target} is an OpenCL target and cannot be built {where}: OpenCL binaries only "
                              "load on the machine and driver that built them",
                              "build it on that machine, in the process that builds (without --cluster)")


def _as_completed(futures, stall_timeout: float | None):
    """(future, None) as each finishes; once none has for ``stall_timeout`` seconds, (future,
    why) for each still out, cancelled."""
    pending = set(futures)
    while pending:
        finished, pending = concurrent.futures.wait(pending, timeout=stall_timeout,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
        if not finished:
            why = (f"given up: no compile finished for {stall_timeout:g} s (are the cluster's workers still "
                   "there? see the scheduler's dashboard), so the compiles still out were cancelled")
            for future in pending:
                future.cancel()
                yield future, why
            return
        for future in finished:
            yield future, None


def build(jobs: Sequence[Job], compilers: dict[Target, Compiler], out: Path, *, parallel: int | None = None,
          executor: concurrent.futures.Executor | None = None, search_path: KernelSearchPath | None = None,
          progress: Callable[[int, int, int], None] | None = None, stall_timeout: float | None = None) -> BuildResult:
    """Compile ``jobs`` into one bundle per target under ``out`` (created), reusing what each
    existing bundle already holds.

    Args:
        parallel: worker processes when no ``executor`` is given (default: every core; 1
            compiles in this process, as the OpenCL compiler must, its device being this process's).
        executor: where to run the compiles instead (a Dask client's, say); it stays open.
            Each call carries its compiler, job and kernel source, and checks its worker's
            kdbkit and compiler against :func:`builder_identity` of this machine's.
        progress: called as (done, total, failed) after each compile.
        stall_timeout: seconds without any compile finishing after which the compiles still
            out are given up, each reported as a failure (what did compile is written): a
            cluster whose workers are gone would otherwise be waited on forever. None: no limit.

    Raises:
        TargetError: an OpenCL job with an ``executor``.
    """
    if executor is not None:
        refuse_local_only({job.bundle for job in jobs}, "by another executor")
    out.mkdir(parents=True, exist_ok=True)
    search_path = search_path or KernelSearchPath()
    result = BuildResult()
    by_bundle: dict[Target, list[Job]] = {}
    for job in jobs:
        by_bundle.setdefault(job.bundle, []).append(job)
    entries: dict[Target, dict[tuple[str, str], StoredBlob]] = {}
    stale: set[Target] = set()  # bundles holding programs no job wants any more: rewritten
    todo: list[Job] = []
    for target, target_jobs in by_bundle.items():
        kept = _reusable(out / target.bundle_name(), target, compilers[target].identity())
        if set(kept) - {(job.kernel_name, job.kernel_args) for job in target_jobs}:
            stale.add(target)
        entries[target] = {}
        for job in target_jobs:
            binary = kept.get((job.kernel_name, job.kernel_args))
            if binary is None:
                todo.append(job)
            else:
                entries[target][job.kernel_name, job.kernel_args] = binary
                result.reused += 1
    sources = {name: search_path.read(name) for name in {job.request.kernel_file for job in todo}}
    expected = {target: builder_identity(compiler) for target, compiler in compilers.items()}
    own = executor is None and bool(todo)  # an executor made here is shut down here
    if own:
        workers = parallel or os.cpu_count() or 1
        if any(spec_for(compilers[job.bundle].backend).machine_local for job in todo):
            workers = 1
        executor = concurrent.futures.ProcessPoolExecutor(workers) if workers > 1 else _InProcess()
    done = 0
    try:
        # Larger sources first: they tend to compile longest, and a long compile started last
        # would leave the other workers idle at the end.
        size = {name: sum(len(f.data) for f in source.files) for name, source in sources.items()}
        first = sorted(range(len(todo)), key=lambda i: -size[todo[i].request.kernel_file])
        futures = {executor.submit(_compile, compilers[todo[i].bundle], todo[i], sources[todo[i].request.kernel_file],
                                   expected[todo[i].bundle]): i for i in first}
        for future, outcome in _as_completed(futures, stall_timeout):
            job = todo[futures[future]]
            if outcome is not None:  # given up: nothing finished for stall_timeout seconds
                binary, message, log = None, outcome, ""
            else:
                try:
                    binary, message, log = future.result()
                except Exception as exc:  # the worker, not the compiler, failed (lost, killed): the rest goes on
                    binary, message, log = None, f"its worker failed ({type(exc).__name__}: {exc})", "".join(
                        traceback.format_exception(exc))
            done += 1
            if binary is None:
                result.failures.append(Failure(job, message, log))
            else:
                entries[job.bundle][job.kernel_name, job.kernel_args] = binary
                result.compiled += 1
            if progress:
                progress(done, len(todo), len(result.failures))
    finally:
        if own:
            executor.shutdown()
    order = {id(job): i for i, job in enumerate(todo)}
    result.failures.sort(key=lambda failure: order[id(failure.job)])  # in plan order, wherever they ran
    changed = stale | {job.bundle for job in todo}
    for target, held in entries.items():
        path = out / target.bundle_name()
        compiler = compilers[target]
        if target in changed or not path.exists():
            manifest = {job.request.kernel_file: job.source_digest for job in by_bundle[target]
                        if (job.kernel_name, job.kernel_args) in held and job.source_digest}
            write_stored_bundle(path, target, [(n, a, b) for (n, a), b in sorted(held.items())],
                                compiler=compiler.identity(), binary_format=compiler.binary_format, sources=manifest)
        result.bundles[str(target)] = path
    return result


class _InProcess(concurrent.futures.Executor):
    """Runs each call as it is submitted, in this process (one worker; the OpenCL compiler)."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _reusable(path: Path, target: Target, identity: str) -> dict[tuple[str, str], StoredBlob]:
    """What an existing bundle at ``path`` holds that a build for ``target`` with ``identity``
    may keep: everything, when it was written for that target by that compiler; else nothing."""
    if not path.exists():
        return {}
    try:
        with Bundle.open(path) as bundle:
            meta = bundle.metadata
            if meta.target != target or meta.compiler != identity:
                return {}
            return {(name, args): stored for name, args, stored in bundle.stored_items()}
    except KdbError:
        return {}  # damaged or foreign: rebuilt whole, then replaced atomically
