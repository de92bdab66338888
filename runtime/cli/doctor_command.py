"""``kdb doctor``: one screen that says what kdbkit sees and what is wrong."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import out, print_json


def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Report library and compiler versions, paths searched, bundles found and missing, and cache health.

    Exits 1 when it finds a problem (marked ✗), so scripts can check a machine.

    Example: kdb doctor --json
    """
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
