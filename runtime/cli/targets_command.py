"""``kdb targets``: the table of known GPUs (name, product, arch, compute units, the target a
build names) and what the compilers installed here can build. The CLI is the one place the
runtime imports the packager."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import out, print_json


def targets(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List the known GPUs (--gpu names, their arch and compute units) and what the compilers here build.

    Example: kdb targets
    """
    from kdbkit.packager.targets import KNOWN_GPUS, buildable_here, compiler_reports

    gpus = [{"gpu": g.name, "aliases": list(g.aliases), "product": g.product, "arch": g.arch, "cu": g.cu,
             "target": str(g.target), "built_by": buildable_here(g)} for g in KNOWN_GPUS]
    compilers = [{"compiler": r.name, "backend": r.backend, "identity": r.identity, "missing": r.missing,
                  "archs": list(r.archs) if r.archs is not None else None} for r in compiler_reports()]
    if as_json:
        print_json({"gpus": gpus, "compilers": compilers})
        return
    table = Table(title="known GPUs (kdb build --gpu NAME, or --target TARGET)")
    for col in ("--gpu", "product", "target", "built here by"):
        table.add_column(col, overflow="fold")
    for g in gpus:
        built = g["built_by"]
        table.add_row(g["gpu"], escape(g["product"]), g["target"],
                      f"[yellow]{escape(built)}[/]" if built.startswith("no:") else escape(built))
    out.print(table)
    for c in compilers:
        if c["identity"] is None:
            out.print(f"[yellow]{c['compiler']} ({c['backend']}): not available[/]: {escape(c['missing'] or '')}")
        elif c["archs"] is None:
            out.print(f"{c['compiler']} ({c['backend']}): {escape(c['identity'])}: any arch it accepts")
        else:
            out.print(f"{c['compiler']} ({c['backend']}): {escape(c['identity'])}: {', '.join(c['archs'])}")
    out.print("OpenCL: the local devices only (kdb devices), as PoCL's binaries are tied to the machine")
