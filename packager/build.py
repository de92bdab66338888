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
needs (the compiler, the job, the kernel source), so a worker needs only kdbkit and the
compiler; the keys are made here, by :func:`plan`, and each call first checks that its
worker's kdbkit and compiler are the ones the keys were made with.

Each kernel source is read once (:meth:`KernelSearchPath.read`, as the runtime's JIT reads
it): :func:`plan` keys every program by that read's digest and keeps the read in the job, and
the compile is given that same read, so a source edited during a build can never be stored
under the key of its earlier text. This is the only builder: the local, sharded, cluster and
device builds (:func:`kdbkit.packager.device_build.build_bundle`) all run :func:`build`.

The workers also compress what they compile (zstd level 19, no dictionary), so writing a
bundle is only inserting rows: compressing at level 19 in this one process after the compiles
serialised work the workers can share, and capped a wide build's speed-up (scripts/bench_build.py
measures it). A trained dictionary is not used:
it made bundles 3.5% smaller and needs every binary before the first can be compressed
(``kdb db merge`` still trains one where it pays).

Reproducible (``reproducible=True``, or ``SOURCE_DATE_EPOCH`` set): the same sources, catalogue
and compilers give the same bundles, byte for byte, in any folder, at any time. The rows are
written sorted by key into a new file (always); the bundle records ``SOURCE_DATE_EPOCH``'s time
or none (:mod:`kdbkit.kdb.reproducible`); a compiler whose output depends on its process
(NVRTC) compiles each program in a fresh process (:mod:`kdbkit.packager.fresh_compile`); an
existing bundle's entries are kept only where they were built the same way, and the bundle is
rewritten where its metadata is not what this build writes. A compiler that never gives the
same bytes (PoCL) is named in ``BuildResult.not_reproducible``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kdbkit.kdb import Target
from kdbkit.kdb.codec import StoredBlob, encode_for_bundle
from kdbkit.kdb.bundle import Bundle, BundleMetadata
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.reproducible import created_stamp, reproducible_mode
from kdbkit.kdb.writer import write_stored_bundle
from kdbkit.kdb.version import __version__
from kdbkit.packager.catalogue import programs_for
from kdbkit.packager.code_object_checks import refuse_failing_code_object
from kdbkit.packager import worker_pool
from kdbkit.packager.errors import TargetError
from kdbkit.packager.fresh_compile import compile_fresh
from kdbkit.packager.targets import builder_of
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.compilers import Compiler
from kdbkit.runtime.errors import CompilerUnavailableError, KernelSourceError
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
    # The read the key was made from, compiled as it is (shared by the jobs of one file; sent to
    # a worker beside the job, not in it). None for a job made by hand: build() reads it then.
    source: KernelSource | None = field(default=None, compare=False, repr=False)


@dataclass
class Failure:
    job: Job
    message: str
    log: str = ""
    error: KdbError | None = None  # what the compile raised (None: the worker itself failed)


@dataclass
class BuildResult:
    """Per bundle written or left as it was; counts; failures with their logs; in a reproducible
    build, the bundles that may still differ from another build's, and why."""

    bundles: dict[str, Path] = field(default_factory=dict)
    compiled: int = 0
    reused: int = 0
    failures: list[Failure] = field(default_factory=list)
    not_reproducible: dict[str, str] = field(default_factory=dict)


def depends_on_count(request: ProgramRequest) -> bool:
    """Whether a program is compiled for one compute-unit count (an option naming it)."""
    return any(option.startswith("-DKDB_CU") for option in request.options)


def plan(targets: Sequence[Target], problems: Sequence[Problem] | None = None, *,
         requests: Sequence[ProgramRequest] | None = None, search_path: KernelSearchPath | None = None,
         compiler: Compiler | None = None, exact: bool = False) -> tuple[list[Job], dict[Target, Compiler]]:
    """Every (bundle, program) the targets need, each once, in a fixed order; and each bundle's compiler.

    Args:
        targets: from :func:`~kdbkit.packager.targets.resolve_targets`.
        problems: the catalogue's problems (their solvers' programs per backend), or
        requests: the programs themselves, for every target (neither: ``--all``, every program
            each target's backend builds).
        search_path: where kernel files are found (the default path if None).
        compiler: the compiler for every target, instead of :func:`builder_of` each.
        exact: every program goes to its target's own bundle, as a device build writes it
            (by default the arch-wide bundle, unless a program depends on the count).

    Raises:
        KernelSourceError: a kernel file (or one it includes) cannot be read.
        TargetError, CompilerUnavailableError: no compiler here builds a target.
    """
    from kdbkit.runtime.primitives.catalogue import all_programs

    search_path = search_path or KernelSearchPath()
    reads: dict[str, KernelSource] = {}  # each kernel file read once, whatever the targets
    jobs: dict[tuple, Job] = {}
    compilers: dict[Target, Compiler] = {}
    for target in targets:
        builder = compiler or builder_of(target)
        identity = builder.identity()
        wanted = requests if requests is not None else (
            programs_for(problems, target.backend, target) if problems is not None
            else all_programs(target.backend, target))
        for request in wanted:
            bundle = target if exact or depends_on_count(request) else target.arch_wide()
            compilers.setdefault(bundle, builder)
            source = reads.get(request.kernel_file)
            if source is None:
                source = reads[request.kernel_file] = search_path.read(request.kernel_file)
            key = program_key(request, target=bundle, compiler=identity, source_digest=source.digest)
            jobs.setdefault((str(bundle), key.kernel_name, key.kernel_args),
                            Job(bundle, request, key.kernel_name, key.kernel_args, source.digest, source))
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


def _compile(compiler: Compiler, job: Job, source: KernelSource, expected: str | None = None,
             fresh: bool = False) -> tuple[StoredBlob | None, KdbError | None, str]:
    """(the binary as the bundle stores it, or the error that stopped it, and why the binary may
    differ from another build's or "") of one job, compiled from ``source`` only if it is the read
    the job was keyed by; runs in a worker process, maybe on another machine. The worker
    compresses too (zstd level 19), so that writing the bundles afterwards is only inserts and
    does not serialise the build.

    ``expected`` is :func:`builder_identity` where the keys were made: a worker whose kdbkit or
    compiler differs refuses the job rather than store a binary under another compiler's key.
    ``fresh``: compile in a new process (:func:`~kdbkit.packager.fresh_compile.compile_fresh`).
    """
    try:
        if expected is not None and (here := builder_identity(compiler)) != expected:
            raise CompilerUnavailableError(f"{socket.gethostname()} has {here}, not {expected} (the keys' compiler)",
                                           "install the same kdbkit and compiler on every worker")
        if job.source_digest and source.digest != job.source_digest:  # never stored under another text's key
            raise KernelSourceError(f"{job.request.kernel_file} changed after it was keyed (digest {source.digest[:12]}, "
                                    f"keyed {job.source_digest[:12]})", "build again: the plan reads it anew")
        note = ""
        if fresh:
            binary, note = compile_fresh(compiler, job.request, job.bundle, source)
        else:
            binary = compiler.compile(job.request, job.bundle, source)
        if compiler.binary_format == "hsaco":
            refuse_failing_code_object(binary, job.request, job.bundle)
        return encode_for_bundle(job.kernel_name, job.kernel_args, binary), None, note
    except KdbError as exc:
        return None, exc, ""


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


def compile_workers(parallel: int | None = None) -> int:
    """Compiler processes for a local build: ``parallel`` if given, else
    ``KDB_COMPILE_PARALLEL_LEVEL`` (default 20, as MIOpen's), never more than the cores."""
    from kdbkit.runtime import env

    level = parallel or env.get_int("KDB_COMPILE_PARALLEL_LEVEL") or 1
    return level if parallel else max(1, min(level, os.cpu_count() or 1))


def build(jobs: Sequence[Job], compilers: dict[Target, Compiler], out: Path, *, parallel: int | None = None,
          executor: concurrent.futures.Executor | None = None, search_path: KernelSearchPath | None = None,
          progress: Callable[[int, int, int], None] | None = None, stall_timeout: float | None = None,
          file_names: dict[Target, str] | None = None, record_as: dict[Target, Target] | None = None,
          whole: bool = False, reproducible: bool = False) -> BuildResult:
    """Compile ``jobs`` into one bundle per target under ``out`` (created), reusing what each
    existing bundle already holds.

    Args:
        parallel: worker processes when no ``executor`` is given (default: :func:`compile_workers`;
            1 compiles in this process, as the OpenCL compiler must, its device being this process's).
        executor: where to run the compiles instead (a Dask client's, say); it stays open.
            Each call carries its compiler, job and kernel source, and checks its worker's
            kdbkit and compiler against :func:`builder_identity` of this machine's.
        progress: called as (done, total, failed) after each compile.
        stall_timeout: seconds without any compile finishing after which the compiles still
            out are given up, each reported as a failure (what did compile is written): a
            cluster whose workers are gone would otherwise be waited on forever. None: no limit.
        search_path: where the kernel files of jobs made without their read are read (once each).
        file_names: a bundle's file name, where not its target's bundle name.
        record_as: the target a bundle's metadata names, where not the one its programs were
            compiled for (a test's bundle for another arch, say).
        whole: write nothing unless every job compiled (a device build's contract).
        reproducible: bundles that another build of the same inputs gives byte for byte (the
            module's docstring says how); on too where ``SOURCE_DATE_EPOCH`` is set.

    Raises:
        TargetError: an OpenCL job with an ``executor``.
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed (before anything compiles).
    """
    if executor is not None:
        refuse_local_only({job.bundle for job in jobs}, "by another executor")
    reproducible = reproducible_mode(reproducible)
    stamp = created_stamp(reproducible)
    out.mkdir(parents=True, exist_ok=True)
    names, recorded = file_names or {}, record_as or {}
    result = BuildResult()
    by_bundle: dict[Target, list[Job]] = {}
    for job in jobs:
        by_bundle.setdefault(job.bundle, []).append(job)
    entries: dict[Target, dict[tuple[str, str], StoredBlob]] = {}
    # Bundles rewritten even where nothing compiles: holding programs no job wants any more, or,
    # in a reproducible build, metadata other than this build's (another time, not reproducible).
    stale: set[Target] = set()
    todo: list[Job] = []
    for target, target_jobs in by_bundle.items():
        compiler = compilers[target]
        if reproducible and compiler.determinism != "deterministic":
            result.not_reproducible.update(_not_reproducible(target, compiler))
        kept, written = _reusable(out / names.get(target, target.bundle_name()), recorded.get(target, target),
                                  compiler.identity(), reproducible and compiler.determinism != "deterministic")
        if set(kept) - {(job.kernel_name, job.kernel_args) for job in target_jobs}:
            stale.add(target)
        if reproducible and written is not None and (not written.reproducible or written.created != stamp):
            stale.add(target)
        entries[target] = {}
        for job in target_jobs:
            binary = kept.get((job.kernel_name, job.kernel_args))
            if binary is None:
                todo.append(job)
            else:
                entries[target][job.kernel_name, job.kernel_args] = binary
                result.reused += 1
    sources = _sources_of(todo, search_path)
    expected = {target: builder_identity(compiler) for target, compiler in compilers.items()}
    own = executor is None and bool(todo)  # an executor made here is shut down here
    if own:
        workers = compile_workers(parallel)
        if any(spec_for(compilers[job.bundle].backend).machine_local for job in todo):
            workers = 1
        executor = worker_pool.process_pool(workers) if workers > 1 else _InProcess()
    done, futures, interrupted = 0, {}, False
    try:
        # Larger sources first: they tend to compile longest, and a long compile started last
        # would leave the other workers idle at the end.
        size = {name: sum(len(f.data) for f in source.files) for name, source in sources.items()}
        first = sorted(range(len(todo)), key=lambda i: -size[todo[i].request.kernel_file])
        with worker_pool.submitting(executor):  # the workers this starts ignore Ctrl-C from the first instruction
            for i in first:
                compiler = compilers[todo[i].bundle]
                futures[executor.submit(_compile, compiler, dataclasses.replace(todo[i], source=None),
                                        sources[todo[i].request.kernel_file], expected[todo[i].bundle],
                                        reproducible and compiler.determinism == "fresh-process")] = i
        for future, outcome in _as_completed(futures, stall_timeout):
            job = todo[futures[future]]
            binary, error, message, log, note = None, None, "", "", ""
            if outcome is not None:  # given up: nothing finished for stall_timeout seconds
                message = outcome
            else:
                try:
                    binary, error, note = future.result()
                except Exception as exc:  # the worker, not the compiler, failed (lost, killed): the rest goes on
                    message = f"its worker failed ({type(exc).__name__}: {exc})"
                    log = "".join(traceback.format_exception(exc))
            done += 1
            if binary is None:
                if error is not None:
                    message, log = error.problem, getattr(error, "log", "") or ""
                result.failures.append(Failure(job, message, log, error))
            else:
                entries[job.bundle][job.kernel_name, job.kernel_args] = binary
                result.compiled += 1
                if note:
                    result.not_reproducible.setdefault(str(job.bundle), f"{job.request.kernel_file}: {note}")
            if progress:
                progress(done, len(todo), len(result.failures))
    except KeyboardInterrupt:  # Ctrl-C: stop every compile now; nothing has been written yet
        interrupted = True
        worker_pool.stop(executor, futures)
        raise
    finally:
        if own and not interrupted:
            executor.shutdown()
    order = {id(job): i for i, job in enumerate(todo)}
    result.failures.sort(key=lambda failure: order[id(failure.job)])  # in plan order, wherever they ran
    if whole and result.failures:
        return result
    changed = stale | {job.bundle for job in todo}
    for target, held in entries.items():
        path = out / names.get(target, target.bundle_name())
        compiler = compilers[target]
        if target in changed or not path.exists():
            manifest = {job.request.kernel_file: job.source_digest for job in by_bundle[target]
                        if (job.kernel_name, job.kernel_args) in held and job.source_digest}
            write_stored_bundle(path, recorded.get(target, target), [(n, a, b) for (n, a), b in sorted(held.items())],
                                compiler=compiler.identity(), binary_format=compiler.binary_format, sources=manifest,
                                reproducible=reproducible)
        result.bundles[str(target)] = path
    return result


def _sources_of(jobs: Sequence[Job], search_path: KernelSearchPath | None) -> dict[str, KernelSource]:
    """Each job's kernel source: the read :func:`plan` keyed it by, else one read per file here,
    refused (a failure of the compile, not a crash) where it no longer has the digest keyed."""
    sources: dict[str, KernelSource] = {}
    for job in jobs:
        if job.source is not None:
            sources.setdefault(job.request.kernel_file, job.source)
    unread = {job.request.kernel_file for job in jobs} - set(sources)
    if unread:
        search_path = search_path or KernelSearchPath()
        sources.update({name: search_path.read(name) for name in unread})
    return sources


class _InProcess(concurrent.futures.Executor):
    """Runs each call as it is submitted, in this process (one worker; the OpenCL compiler)."""

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _reusable(path: Path, target: Target, identity: str,
              reproducible: bool = False) -> tuple[dict[tuple[str, str], StoredBlob], BundleMetadata | None]:
    """What an existing bundle at ``path`` holds that a build for ``target`` with ``identity``
    may keep: everything, when it was written for that target by that compiler (and, where
    ``reproducible``, by a reproducible build: a compiler whose bytes depend on its process
    gave them in one of its fresh processes); else nothing. And the bundle's metadata (None
    where there is no bundle of this build's there)."""
    if not path.exists():
        return {}, None
    try:
        with Bundle.open(path) as bundle:
            meta = bundle.metadata
            if meta.target != target or meta.compiler != identity:
                return {}, None
            if reproducible and not meta.reproducible:
                return {}, meta
            return {(name, args): stored for name, args, stored in bundle.stored_items()}, meta
    except KdbError:
        return {}, None  # damaged or foreign: rebuilt whole, then replaced atomically


def _not_reproducible(target: Target, compiler: Compiler) -> dict[str, str]:
    """Why a reproducible build's bundle for ``target`` may still differ from another build's."""
    if compiler.determinism == "none":
        return {str(target): f"{compiler.name} gives other bytes on every build (docs/reliability.md)"}
    if compiler.determinism == "unmeasured":
        return {str(target): f"whether {compiler.name} gives the same bytes twice was never measured"}
    return {}
