"""``kdb env``: every KDB_* variable with its current value and meaning."""

from __future__ import annotations

import warnings

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime import env as kdb_env
from kdbkit.runtime.cli.output import err, out, print_json


def env(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
        only_set: bool = typer.Option(False, "--set", help="Show only the variables that are set.")) -> None:
    """List every KDB_* variable: its value now, its default, and what it does.

    Example: KDB_DISABLE_JIT=1 kdb env --set
    """
    with warnings.catch_warnings(record=True) as caught:  # bad values are shown in the table instead
        warnings.simplefilter("always")
        rows = kdb_env.snapshot()
    rows = [r for r in rows if r[1] is not None] if only_set else rows
    unknown = kdb_env.unknown_kdb_variables()
    if as_json:
        print_json({"variables": [{"name": v.name, "kind": v.kind, "value": raw, "effective": parsed,
                                   "default": v.default, "meaning": v.meaning} for v, raw, parsed in rows],
                    "unknown": unknown, "warnings": [str(w.message) for w in caught]})
        return
    table = Table(title="kdbkit environment variables")
    table.add_column("variable", style="bold", no_wrap=True)
    table.add_column("set to")
    table.add_column("effective")
    table.add_column("meaning", overflow="fold")
    for var, raw, parsed in rows:
        table.add_row(var.name, "-" if raw is None else escape(repr(raw)), escape(str(parsed)), escape(var.meaning))
    out.print(table)
    for w in caught:
        err.print(f"[yellow]warning:[/] {escape(str(w.message))}", soft_wrap=True)
    for name in unknown:
        err.print(f"[yellow]warning:[/] {escape(name)} is set but kdbkit does not read it", soft_wrap=True)
