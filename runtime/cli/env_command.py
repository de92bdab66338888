"""``kdb env``: every KDB_* variable with its current value and meaning."""

from __future__ import annotations

import difflib

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime import env as kdb_env
from kdbkit.runtime.cli.output import err, out, print_json
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.solver import switches as solver_switches


def env(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
        only_set: bool = typer.Option(False, "--set", help="Show only the variables that are set.")) -> None:
    """List every KDB_* variable: its value now, its default, and what it does.

    Example: KDB_DISABLE_JIT=1 kdb env --set
    """
    switches = solver_switches()
    rows = [_password_hidden(_find_only_checked(row)) for row in kdb_env.snapshot(extra=switches)]
    rows = [r for r in rows if r[1] is not None] if only_set else rows
    unknown = kdb_env.unknown_kdb_variables(known=[s.name for s in switches])
    problems = [problem for *_, problem in rows if problem]
    if as_json:
        print_json({"variables": [{"name": v.name, "kind": v.kind, "value": raw, "effective": parsed,
                                   "default": v.default, "meaning": v.meaning, "problem": problem}
                                  for v, raw, parsed, problem in rows],
                    "unknown": unknown, "warnings": problems})
        return
    table = Table(title="kdbkit environment variables")
    table.add_column("variable", style="bold", no_wrap=True)
    table.add_column("set to")
    table.add_column("effective")
    table.add_column("meaning", overflow="fold")
    for var, raw, parsed, _ in rows:
        table.add_row(var.name, "-" if raw is None else escape(repr(raw)), escape(str(parsed)), escape(var.meaning))
    out.print(table)
    for problem in problems:
        err.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)
    for name in unknown:
        err.print(f"[yellow]warning:[/] {escape(name)} is set but kdbkit does not read it", soft_wrap=True)


def _password_hidden(row: tuple) -> tuple:
    """KDB_REMOTE_CACHE's row with its password (if the URL holds one) shown as ***."""
    var, raw, parsed, problem = row
    if var.name == "KDB_REMOTE_CACHE" and raw:
        from kdbkit.runtime.redis_link import redacted

        return var, redacted(raw), redacted(parsed) if isinstance(parsed, str) else parsed, problem
    return row


def _find_only_checked(row: tuple) -> tuple:
    """KDB_DEBUG_FIND_ONLY_SOLVER's row with a problem when no solver has its id or name (find
    would refuse every problem; immediate mode does not read it, so nothing else would say so)."""
    var, raw, parsed, problem = row
    if var.name != "KDB_DEBUG_FIND_ONLY_SOLVER" or not parsed or REGISTRY.find(parsed.strip()) is not None:
        return row
    ids = sorted(s.id for s in REGISTRY)
    close = difflib.get_close_matches(parsed.strip(), [s.name for s in REGISTRY], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return var, raw, parsed, (f"{var.name}={raw!r}: no solver has that id or name, so find refuses every problem; "
                              f"{hint}give a solver id ({ids[0]}-{ids[-1]}) or name, or unset it")
