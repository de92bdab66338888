"""``kdb doctor``: one screen that says what kdbkit sees and what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import fail, out, print_json


def doctor(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    locked: Optional[Path] = typer.Option(None, "--locked", help="Instead, check this environment against a lock "
                                          "file (`kdb lock` wrote it): every locked package installed with the same "
                                          "bundles and find-dbs, nothing else serving a device, kdbkit in range. "
                                          "One line per difference.", show_default=False),
    target: List[str] = typer.Option([], "--target", help="With --locked: the devices to check for extra bundles "
                                     "(sm_90_132, gfx942_304) instead of the local ones. Repeatable."),
) -> None:
    """Report library and compiler versions, paths searched, bundles found and missing, and cache health.

    Exits 1 when it finds a problem (marked ✗), so scripts can check a machine; with --locked, when the
    environment differs from the lock (a CI step for deployments).

    Example: kdb doctor --json
    """
    if locked is not None:
        from kdbkit.runtime.cli.lock_command import doctor_locked

        doctor_locked(locked, target, as_json)
        return
    if target:
        raise fail("--target goes with --locked (the report covers this machine's devices)", 2)
    from kdbkit.runtime.doctor import report

    rows = report()
    problems = [r for r in rows if not r.ok]
    if as_json:
        print_json([r.__dict__ for r in rows])
        if problems:
            raise typer.Exit(1)
        return
    table = Table(title="kdb doctor")
    for col in ("section", "item", "value"):
        table.add_column(col, overflow="fold")
    for r in rows:
        mark = "" if r.ok else "[red]✗[/] "
        table.add_row(r.section, escape(r.item), mark + escape(r.value))
    out.print(table)
    if problems:
        out.print(f"{len(problems)} problem(s)")
        raise typer.Exit(1)
    out.print("no problems found")
