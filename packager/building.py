"""``build_bundles``: the offline build as one call (what ``kdb build``, ``kdb demo`` and the
tests run): a catalogue's problems (or every program), the targets, an optional shard, and
where the compiles run (local processes or a Dask cluster) -> bundles and a report; optionally
what it built published to a cluster cache (:mod:`kdbkit.packager.publish`).

The steps are the builder's (:mod:`kdbkit.packager.build`); this module only puts them in order
and refuses, before anything compiles, what cannot build: no catalogue, a catalogue naming no
problem, a cluster with a local worker count, an OpenCL target on a cluster, a ``publish``
destination that is no Redis URL.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kdbkit.kdb import Target
from kdbkit.kdb.reproducible import created_stamp, reproducible_mode
from kdbkit.packager import build as builder
from kdbkit.packager import provenance
from kdbkit.packager import publish as publishing
from kdbkit.packager.catalogue import LineError, read_catalogues
from kdbkit.packager.errors import CatalogueError
from kdbkit.packager.targets import resolve_targets
from kdbkit.runtime.problem import Problem

_WRITE_ONE = ("write one problem a line (a config string or a driver command: `KDB_ENABLE_LOGGING_CMD=1` prints "
              "them), name a built-in network, or build every program with --all")


@dataclass
class BuildReport:
    """What a build wrote (:class:`~kdbkit.packager.build.BuildResult`), and what it skipped."""

    result: builder.BuildResult
    skipped_lines: list[LineError] = field(default_factory=list)
    planned: int = 0  # programs in this build (this shard's, with a shard)
    workers: int | None = None  # local compiler processes (None: on a cluster)
    cluster_workers: list[str] = field(default_factory=list)
    published: publishing.PublishReport | None = None  # with ``publish``: what reached the cluster cache

    @property
    def ok(self) -> bool:
        return not self.result.failures and not self.skipped_lines


def build_bundles(targets: Sequence[str | Target] = (), *, gpus: Sequence[str] = (),
                  catalogues: Sequence[str | Path] = (), problems: Sequence[Problem] | None = None,
                  every: bool = False, out: Path = Path("."), shard: tuple[int, int] | None = None,
                  workers: int | None = None, cluster: str | None = None, stall_timeout: float = 600.0,
                  publish: str | None = None, reproducible: bool = False,
                  progress: Callable[[int, int, int], None] | None = None,
                  on_cluster: Callable[[list[str]], None] | None = None,
                  on_skipped: Callable[[list[LineError]], None] | None = None) -> BuildReport:
    """Compile what a catalogue needs for each target into bundles under ``out``.

    Args:
        targets: ``sm_90_132``, ``gfx942`` (or :class:`Target`\\ s); gpus: names from the table
            of known GPUs (``kdb targets``).
        catalogues: catalogue files or built-in network names; or ``problems`` directly; or
            ``every``: every program each target's backend builds. Exactly one of the three.
        shard: (index, count): only that slice of the plan (``kdb db merge`` joins the slices).
        workers: local compiler processes (default: ``KDB_COMPILE_PARALLEL_LEVEL``, at most the
            cores); not with ``cluster``, whose workers run one compile per thread.
        cluster: a Dask scheduler (``tcp://HOST:PORT``, ``HOST:PORT``, a scheduler file): the
            compiles run on its workers, the bundles are written here.
        stall_timeout: with ``cluster``, seconds without a finished compile before the rest is
            given up (reported as failures).
        publish: a cluster cache, ``redis://[user:password@]host:port/db``: every program the
            build compiled or reused is stored there too, after the bundles are written, by this
            process (a cluster's workers need no access to it), keyed as a node's lookups key it
            (:mod:`kdbkit.packager.publish` says which nodes that serves). A server that is down
            or refuses this user's writes does not fail the build: ``report.published`` says
            what was not published and why.
        reproducible: bundles another build of the same sources, catalogue and compilers gives
            byte for byte, in any folder, at any time (on too where ``SOURCE_DATE_EPOCH`` is set;
            :mod:`kdbkit.packager.build` says how); ``report.result.not_reproducible`` names the
            bundles whose compiler cannot promise it.
        progress: called as (done, total, failed) after each compile.
        on_cluster: called with the cluster's workers once they passed their check.
        on_skipped: called with the catalogue lines that did not parse, before anything compiles.

    Returns:
        The report; its ``result.failures`` and ``skipped_lines`` say what did not build.

    Raises:
        CatalogueError: no catalogue (or more than one kind), a catalogue naming no problem, or
            no program for the targets; ``workers`` with ``cluster``.
        PublishError: ``publish`` is not a Redis URL, or the redis client is missing (before
            anything compiles).
        TargetError: an unknown or unbuildable target; an OpenCL target with ``cluster``.
        CompilerUnavailableError: no compiler for a target here, or the cluster cannot build.
        KdbError: ``SOURCE_DATE_EPOCH`` is set but not a number of seconds (before anything compiles).
        OSError: a catalogue file cannot be read.
    """
    if sum((bool(catalogues), problems is not None, every)) != 1:
        raise CatalogueError("give a catalogue or every program (--all), and only one of them", _WRITE_ONE)
    if cluster is not None and workers is not None:
        raise CatalogueError("a local worker count (-j) does not apply to a cluster build",
                             "leave -j out with --cluster: each Dask worker runs one compile per thread")
    if cluster is not None:  # refused before resolving, which would look for the target's local device
        builder.refuse_local_only(t if isinstance(t, Target) else Target.parse(t) for t in targets)
    if publish is not None:  # a bad destination is refused now, not after the compiles
        publishing.open_tier(publish).close()
    reproducible = reproducible_mode(reproducible)  # a malformed SOURCE_DATE_EPOCH is refused now too
    given = [t for t in targets if isinstance(t, Target)]
    names = [t for t in targets if not isinstance(t, Target)]
    resolved = given + (resolve_targets(names, gpus) if names or gpus or not given else [])
    skipped: list[LineError] = []
    if catalogues:
        read = read_catalogues(catalogues)
        problems, skipped = read.problems, read.errors
        if skipped and on_skipped:
            on_skipped(skipped)
        if not problems:
            why = (f"its {len(skipped)} lines did not parse, the first: {skipped[0]}" if skipped else
                   "it holds no line that names one")
            raise CatalogueError(f"{', '.join(map(str, catalogues))}: no problem to build ({why})", _WRITE_ONE)
    planned, compilers = builder.plan(resolved, problems)
    if not planned:
        raise CatalogueError(f"no program to build: no solver for {', '.join(map(str, resolved))} serves the "
                             f"catalogue's {len(problems or ())} problems",
                             "build for a target whose backend serves them (kdb targets), or check the catalogue")
    if shard is not None:
        planned = builder.shard(planned, *shard)
    report = BuildReport(builder.BuildResult(), skipped, len(planned))
    with contextlib.ExitStack() as stack:
        executor = None
        if cluster is not None:
            from kdbkit.packager import cluster as dask_cluster

            client = stack.enter_context(dask_cluster.connect(cluster))
            report.cluster_workers = dask_cluster.check_workers(client, compilers.values())
            executor = dask_cluster.executor(client)
            if on_cluster:
                on_cluster(report.cluster_workers)
        else:
            report.workers = builder.compile_workers(workers)
        started = created_stamp(reproducible)
        report.result = builder.build(planned, compilers, Path(out), parallel=report.workers, executor=executor,
                                      progress=progress, stall_timeout=stall_timeout if executor else None,
                                      reproducible=reproducible)
    # the build record `kdb package` puts in each package's provenance: when, and from which catalogue
    finished = created_stamp(reproducible)
    catalogue = provenance.catalogue_digest(p.config() for p in problems) if problems is not None else None
    for bundle in dict.fromkeys(report.result.bundles.values()):
        provenance.write_build_record(Path(bundle), started, finished, catalogue)
    if publish is not None:  # by this process, once the bundles are written: workers need no access to Redis
        tier = publishing.open_tier(publish)
        try:
            report.published = publishing.publish(tier, planned, report.result, compilers)
        finally:
            tier.close()
    return report
