"""``kdb demo``: the main job (see runtime/demo.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kdbkit.runtime.cli.output import fail, out


def demo(cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="User cache folder (default: "
                                                   "KDB_CUSTOM_CACHE_DIR if set, else a new empty one, removed after)."),
         device: Optional[int] = typer.Option(None, "--device", help="Device index from `kdb devices`."),
         passes: int = typer.Option(2, "--passes", min=1, help="Fresh processes to run, one after the other.")) -> None:
    """Resolve, run and check the sample kernels in fresh processes: first JIT, then the user cache.

    Example: kdb demo --passes 3
    """
    from kdbkit.runtime.demo import main_job

    runs = main_job(cache_dir, device, passes)
    first = runs[0]
    out.print(f"device: [bold]{first['device']}[/] ({first['backend']}, target {first['target']})")
    table = Table(title="sample kernels, one fresh process per pass")
    table.add_column("kernel")
    for i in range(len(runs)):
        table.add_column(f"pass {i + 1}: source")
        table.add_column("resolve ms", justify="right")
    table.add_column("run ms", justify="right")
    table.add_column("rel. error", justify="right")
    bad = 0
    for k, r in enumerate(first["results"]):
        cells = [r["name"]]
        for run in runs:
            rr = run["results"][k]
            cells += [rr["source"], f"{rr['resolve_ms']:.2f}"]
        worst = max(run["results"][k]["rel_error"] for run in runs)
        ok = all(run["results"][k]["ok"] for run in runs)
        bad += not ok
        cells += [f"{runs[-1]['results'][k]['run_ms']:.2f}", f"{worst:.1e} {'[green]ok[/]' if ok else '[red]WRONG[/]'}"]
        table.add_row(*cells)
    out.print(table)
    if bad:
        raise fail(f"{bad} sample kernel(s) gave wrong results")
    out.print("all results match NumPy")
