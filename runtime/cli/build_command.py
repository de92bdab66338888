"""``kdb build``: compile a catalogue's programs for each target into bundles, offline, with
no GPU (packager/build.py does the work; this is its command line and progress bar)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kdbkit.runtime import env as kdb_env
from kdbkit.runtime.cli.output import err, out, print_json


def build(
    target: List[str] = typer.Option([], "--target", help="A target: <arch>_<compute units> (sm_90_132, "
                                     "gfx942_304) or <arch> for the whole arch (gfx942). Repeat for more."),
    gpu: List[str] = typer.Option([], "--gpu", help="A GPU by name (MI300X, H100-SXM: kdb targets lists them). "
                                  "Repeat for more."),
    catalogue: List[Path] = typer.Option([], "--catalogue", "-c", help="A built-in network (resnet18, resnet50, vgg16, "
                                         "mobilenet_v2, bert_base) or a file of problems: config strings, "
                                         "MIOpen keys or driver commands (the lines KDB_ENABLE_LOGGING_CMD=1 "
                                         "prints, or MIOpen's), or a find-db (.fdb, .ufdb). Repeat for more."),
    every: bool = typer.Option(False, "--all", help="Every program the solvers can ask for (serves every "
                               "problem of every primitive)."),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", min=1, help="Compiler processes. Default: "
                                       "KDB_COMPILE_PARALLEL_LEVEL if set, else every core. Not with --cluster, "
                                       "whose workers run one compile per thread."),
    cluster: Optional[str] = typer.Option(None, "--cluster", metavar="ADDRESS", help="Compile on the workers of "
                                          "a Dask scheduler: tcp://HOST:PORT, HOST:PORT or a scheduler file (pip "
                                          "install 'kdbkit[cluster]'; each worker needs this kdbkit and the "
                                          "compilers). Bundles are written here. Not for OpenCL targets."),
    stall_timeout: float = typer.Option(600.0, "--stall-timeout", min=1.0, metavar="SECONDS", help="With --cluster: "
                                        "give up the compiles still out when none has finished for this long "
                                        "(workers gone), reporting each as failed."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Build only slice I of N (0-based, I/N), for a job "
                                        "runner's array; `kdb db merge` joins the slices' bundles."),
    output: Path = typer.Option(Path("."), "-o", "--out", help="Folder for the bundles (created)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Compile the programs a catalogue needs for each target into bundles (<arch>.kdb), with no GPU.

    Example: kdb build --target sm_90_132 --gpu MI300X --all -o bundles
    (add --cluster tcp://scheduler:8786 to compile on a Dask cluster's workers)
    """
    from kdbkit.kdb import Target
    from kdbkit.packager import build as builder
    from kdbkit.packager.catalogue import read_catalogues
    from kdbkit.packager.targets import resolve_targets

    if bool(catalogue) == every:
        raise typer.BadParameter("give --catalogue FILE (repeatable) or --all", param_hint="--catalogue / --all")
    part = _shard(shard)
    if cluster is not None:  # refused before resolving, which would look for the target's local device
        builder.refuse_local_only(Target.parse(t) for t in target)
    targets = resolve_targets(target, gpu)
    problems, line_errors = None, []
    if catalogue:
        read = read_catalogues(catalogue)
        problems, line_errors = read.problems, read.errors
        for e in line_errors:
            err.print(f"[yellow]skipped[/] {escape(str(e))}")
    planned, compilers = builder.plan(targets, problems)
    if part is not None:
        planned = builder.shard(planned, *part)
    workers = jobs or (kdb_env.get_int("KDB_COMPILE_PARALLEL_LEVEL") if "KDB_COMPILE_PARALLEL_LEVEL" in os.environ
                       else os.cpu_count() or 1)
    with contextlib.ExitStack() as stack:
        executor = None
        if cluster is not None:
            from kdbkit.packager import cluster as dask_cluster

            client = stack.enter_context(dask_cluster.connect(cluster))
            joined = dask_cluster.check_workers(client, compilers.values())
            executor = dask_cluster.executor(client)
            if not as_json:
                err.print(f"compiling on {len(joined)} Dask workers at {escape(cluster)}")
        result = build_with_progress(planned, compilers, output, workers, executor=executor, quiet=as_json,
                                     stall_timeout=stall_timeout if executor is not None else None)
    for failure in result.failures:
        err.print(f"[red]failed[/] {escape(str(failure.job.request))} for {failure.job.bundle}: "
                  f"{escape(failure.message)}")
        if failure.log:
            err.print(escape(failure.log.rstrip()), highlight=False)
    if as_json:
        print_json({"bundles": {t: str(p) for t, p in result.bundles.items()}, "compiled": result.compiled,
                    "reused": result.reused, "failed": len(result.failures),
                    "skipped_lines": [str(e) for e in line_errors]})
    else:
        for name, path in result.bundles.items():
            out.print(f"{name}: {escape(str(path))}")
        out.print(f"{result.compiled} compiled, {result.reused} already built, {len(result.failures)} failed, "
                  f"{len(line_errors)} catalogue lines skipped")
    if result.failures or line_errors:
        raise typer.Exit(1)


def build_with_progress(planned, compilers, output: Path, workers: int, *, executor=None, quiet: bool = False,
                        stall_timeout: float | None = None):
    """packager.build.build with a rich progress bar on stderr (done/total, failures, rate, ETA)."""
    from kdbkit.packager import build as builder

    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
               TextColumn("{task.fields[rate]}/s"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, disable=quiet, transient=False) as bar:
        task = bar.add_task("compile", total=None, failed=0, rate="-")

        def step(done: int, total: int, failed: int) -> None:
            elapsed = bar.tasks[0].elapsed or 0.0
            bar.update(task, completed=done, total=total, failed=failed,
                       rate=f"{done / elapsed:.1f}" if elapsed > 0 else "-")

        return builder.build(planned, compilers, output, parallel=workers, executor=executor, progress=step,
                             stall_timeout=stall_timeout)


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise typer.BadParameter(f"{text!r} is not I/N with 0 <= I < N (e.g. 0/4)", param_hint="--shard")
    return int(m[1]), int(m[2])
