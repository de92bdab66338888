"""``kdb doctor``: one screen that says what kdbkit sees and what is wrong."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import out, print_json


def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Report library and compiler versions, paths searched, bundles found and missing, and cache health.

    Example: kdb doctor --json > doctor.json
    """
    from kdbkit.runtime.doctor import report

    rows = report()
    if as_json:
        print_json([r.__dict__ for r in rows])
        return
    table = Table(title="kdb doctor")
    for col in ("section", "item", "value"):
        table.add_column(col, overflow="fold")
    for r in rows:
        mark = "" if r.ok else "[red]✗[/] "
        table.add_row(r.section, escape(r.item), mark + escape(r.value))
    out.print(table)
    problems = [r for r in rows if not r.ok]
    out.print(f"{len(problems)} problem(s)" if problems else "no problems found")
