"""``kdb build``: compile a catalogue's programs for each target into bundles, offline, with
no GPU, and optionally publish them to a cluster cache (:func:`kdbkit.packager.build_bundles`
does the work; this is its command line, progress bar and summary)."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

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
                                       "KDB_COMPILE_PARALLEL_LEVEL (20 unless set), at most the cores. Not with "
                                       "--cluster, whose workers run one compile per thread."),
    cluster: Optional[str] = typer.Option(None, "--cluster", metavar="ADDRESS", help="Compile on the workers of "
                                          "a Dask scheduler: tcp://HOST:PORT, HOST:PORT or a scheduler file (pip "
                                          "install 'kdbkit\\[cluster]'; each worker needs this kdbkit and the "
                                          "compilers). Bundles are written here. Not for OpenCL targets."),
    stall_timeout: float = typer.Option(600.0, "--stall-timeout", min=1.0, metavar="SECONDS", help="With --cluster: "
                                        "give up the compiles still out when none has finished for this long "
                                        "(workers gone), reporting each as failed."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Build only slice I of N (0-based, I/N), for a job "
                                        "runner's array; `kdb db merge` joins the slices' bundles."),
    publish: Optional[str] = typer.Option(None, "--publish", metavar="URL", help="Also store every program built "
                                          "(or already built) in the cluster cache at this redis://user:password@"
                                          "host:port/db URL (user and password optional), where jobs on nodes with "
                                          "the target's device and this compiler find it instead of compiling (pip "
                                          "install 'kdbkit\\[cluster]'). Done here once the bundles are written; a "
                                          "server down or a read-only user does not fail the build."),
    output: Path = typer.Option(Path("."), "-o", "--out", help="Folder for the bundles (created)."),
    reproducible: bool = typer.Option(False, "--reproducible", help="Bundles that another build of the same "
                                      "sources, catalogue and compilers gives byte for byte: no time recorded "
                                      "unless SOURCE_DATE_EPOCH gives one (setting it turns this on too), each "
                                      "NVRTC program compiled in a fresh process."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Compile the programs a catalogue needs for each target into bundles (<arch>.kdb), with no GPU.

    Example: kdb build --target sm_90_132 --gpu MI300X --all -o bundles
    (add --cluster tcp://scheduler:8786 to compile on a Dask cluster's workers, --publish
    redis://cache:6379/0 to warm the cluster cache with what it builds, --reproducible for
    bit-identical rebuilds)
    """
    from kdbkit.packager import PublishError, build_bundles

    if bool(catalogue) == every:
        raise typer.BadParameter("give --catalogue FILE (repeatable) or --all", param_hint="--catalogue / --all")
    if cluster is not None and jobs is not None:
        raise typer.BadParameter("-j sets local compiler processes; a --cluster build runs one compile per "
                                 "thread of each Dask worker: leave -j out", param_hint="-j / --cluster")
    part = _shard(shard)
    if publish is not None:  # a usage error, before anything compiles
        from kdbkit.packager.publish import open_tier

        try:
            open_tier(publish).close()
        except PublishError as exc:
            raise typer.BadParameter(f"{exc.problem}; {exc.remedy}", param_hint="--publish") from None

    def joined(workers: list[str]) -> None:
        if not as_json:
            err.print(f"compiling on {len(workers)} Dask workers at {escape(cluster)}")

    with progress_bar(quiet=as_json) as step:
        report = build_bundles(target, gpus=gpu, catalogues=catalogue, every=every, out=output, shard=part,
                               workers=jobs, cluster=cluster, stall_timeout=stall_timeout, publish=publish,
                               reproducible=reproducible, progress=step, on_cluster=joined, on_skipped=_print_skipped)
    result, line_errors = report.result, report.skipped_lines
    for failure in result.failures:
        err.print(f"[red]failed[/] {escape(str(failure.job.request))} for {failure.job.bundle}: "
                  f"{escape(failure.message)}")
        if failure.log:
            err.print(escape(failure.log.rstrip()), highlight=False)
    published = report.published
    if as_json:
        print_json({"bundles": {t: str(p) for t, p in result.bundles.items()}, "compiled": result.compiled,
                    "reused": result.reused, "failed": len(result.failures), "workers": report.workers,
                    "skipped_lines": [str(e) for e in line_errors], "not_reproducible": result.not_reproducible,
                    **({"published": published.as_json()} if published is not None else {})})
    else:
        for name, path in result.bundles.items():
            out.print(f"{name}: {escape(str(path))}")
        out.print(f"{result.compiled} compiled, {result.reused} already built, {len(result.failures)} failed, "
                  f"{len(line_errors)} catalogue lines skipped")
        if published is not None:
            _print_published(published)
    for name, why in result.not_reproducible.items():  # on stderr, with --json too
        err.print(f"[yellow]not reproducible[/] {escape(name)}: {escape(why)}")
    if published is not None:  # on stderr, with --json too
        for why, count in published.not_published.items():
            err.print(f"[yellow]not published[/] {count} programs to {escape(published.where)}: {escape(why)}")
    if not report.ok:
        raise typer.Exit(1)


def _print_published(published) -> None:
    """How many programs reached the cluster cache, and which nodes they serve."""
    serves = "; ".join(f"{arch} devices whose compiler is {compiler}" for (arch, compiler) in sorted(published.serves))
    out.print(f"{published.published} programs published to {escape(published.where)}"
              + (f", for {escape(serves)}" if serves else ""))


def _print_skipped(errors) -> None:
    for e in errors:
        err.print(f"[yellow]skipped[/] {escape(str(e))}")


@contextlib.contextmanager
def progress_bar(*, quiet: bool = False):
    """A rich progress bar on stderr (done/total, failures, rate, ETA); yields the builder's
    ``progress`` callback. The bar appears at the first compile, so that an error before any
    (a bad catalogue, a missing compiler) stays one line."""
    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
               TextColumn("{task.fields[rate]}/s"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    bar = Progress(*columns, console=err, disable=quiet, transient=False)
    task = None
    start = time.perf_counter()  # the rate counts from here: the bar only appears at the first compile

    def step(done: int, total: int, failed: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task("compile", total=total, failed=0, rate="-")
        elapsed = time.perf_counter() - start
        bar.update(task, completed=done, total=total, failed=failed,
                   rate=f"{done / elapsed:.1f}" if elapsed > 0 else "-")

    try:
        yield step
    finally:
        if task is not None:
            bar.stop()


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise typer.BadParameter(f"{text!r} is not I/N with 0 <= I < N (e.g. 0/4)", param_hint="--shard")
    return int(m[1]), int(m[2])
