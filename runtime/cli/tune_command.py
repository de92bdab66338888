"""``kdb tune``: find for a catalogue's problems on this machine's GPU, written as a system
find-db to ship beside the bundle (packager/tune.py does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kdbkit.runtime.cli.output import err, out, print_json


def tune(
    catalogue: List[Path] = typer.Option(..., "--catalogue", "-c", help="A catalogue, as `kdb build` takes it: a "
                                         "built-in network (resnet50, ...), a file of problems or driver commands, or a find-db. Repeatable.",
                                         show_default=False),
    output: Path = typer.Option(Path("."), "-o", "--out", help="Folder for <target>.fdb (created; an existing file "
                                "keeps its other problems)."),
    repeat: int = typer.Option(3, "--repeat", min=1, help="Timed launches per solver, after a warm-up."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Rank every solver of a catalogue's problems on this GPU and write a system find-db (<target>.fdb).

    Example: kdb tune -c calls.log -o tuned
    """
    from kdbkit.packager.catalogue import read_catalogues
    from kdbkit.packager.tune import tune as run_tune
    from kdbkit.runtime.handle import Handle

    read = read_catalogues(catalogue)
    problems, skipped = read.problems, read.errors
    for e in skipped:
        err.print(f"[yellow]skipped[/] {escape(str(e))}")
    columns = (TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]} failed"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Handle() as handle, Progress(*columns, console=err, disable=as_json) as bar:
        task = bar.add_task("tune", total=len(problems), failed=0)
        result = run_tune(handle, problems, output, repeat=repeat,
                          progress=lambda done, total, failed: bar.update(task, completed=done, failed=failed))
        device = f"{handle.device.name} ({handle.target})"
    for config, why in result.failures:
        err.print(f"[red]not tuned[/] {escape(config)}: {escape(why)}")
    if as_json:
        print_json({"find_db": str(result.path), "device": device, "tuned": result.tuned, "kept": result.kept,
                    "failed": [{"config": c, "reason": r} for c, r in result.failures],
                    "skipped_lines": [str(e) for e in skipped]})
    else:
        out.print(f"{escape(str(result.path))}: {result.tuned} problems tuned on {escape(device)}, "
                  f"{result.kept} kept from before, {len(result.failures)} failed, {len(skipped)} lines skipped")
    if result.failures or skipped:
        raise typer.Exit(1)
