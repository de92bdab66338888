"""``kdb resolve`` and ``kdb devices``: the lookup chain and the local devices."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime import paths
from kdbkit.runtime.cli.output import out, print_json, size


def resolve(kernel_file: str = typer.Argument(..., help="A kernel source on the search path, e.g. activation.c.",
                                              show_default=False),
            define: List[str] = typer.Option([], "-D", help="A compile-time define NAME=VALUE (repeatable)."),
            device: Optional[int] = typer.Option(None, "--device", help="Device index from `kdb devices`."),
            kernel_path: List[Path] = typer.Option([], "--kernel-path", help="A folder of kernel sources searched "
                                                   "first (repeatable; KDB_KERNEL_PATH is searched next)."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Resolve one program through the chain and show where it came from and each step's time.

    The first rows are what making the handle did once (digest the kernel sources, open the
    best system bundle or the user cache); the rest are this program's lookup. The kernel
    line says which folder of the search path the source came from; the sources lines list
    the chain's tiers in order, where each looks and whether the JIT writes into it.

    Example: kdb resolve activation.c -D KDB_DTYPE=float --device 0
    """
    from kdbkit.runtime.backends.registry import pick_device
    from kdbkit.runtime.handle import Handle
    from kdbkit.runtime.program_key import ProgramRequest

    request = ProgramRequest(kernel_file, [f"-D{d}" for d in define])  # bad options fail before any device work
    with Handle(pick_device(device), kernel_path=kernel_path) as handle:
        program = handle.program(request.kernel_file, request.options)
        folder = handle.kernel_folder(kernel_file)
        tiers = handle.describe_sources()
    data = {"kernel_file": kernel_file, "kernel_folder": str(folder), "options": list(program.options),
            "device": handle.device.name, "target": str(handle.target), "source": program.source,
            "total_ms": round(program.total_ms, 3),
            "steps": [{"step": s.name, "ms": round(s.ms, 3), "outcome": s.outcome} for s in program.steps],
            "handle_steps": [{"step": s.name, "ms": round(s.ms, 3), "outcome": s.outcome}
                             for s in handle.prepare_steps],
            "sources": [{"name": t.name, "where": t.where, "writable": t.writable} for t in tiers]}
    if as_json:
        print_json(data)
        return
    out.print(f"kernel: {escape(kernel_file)} from {escape(str(folder))}")
    table = Table(title=escape(f"{kernel_file} {' '.join(program.options)} on {handle.device.name} ({handle.target})"))
    for col, just in (("step", "left"), ("outcome", "left"), ("ms", "right")):
        table.add_column(col, justify=just)
    for s in handle.prepare_steps:
        table.add_row(escape(f"handle: {s.name}"), escape(s.outcome), f"{s.ms:.3f}", style="dim")
    for s in program.steps:
        table.add_row(escape(s.name), s.outcome, f"{s.ms:.3f}")
    out.print(table)
    out.print("sources, in order after memory:")
    for t in tiers:
        out.print(f"  {escape(t.name)}: {escape(t.where)}{' (writable)' if t.writable else ''}")
    out.print(f"source: [bold]{program.source}[/] in {program.total_ms:.3f} ms")


def devices(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List local devices, their targets, and the system bundle each would use.

    Example: KDB_DEVICE_CU=110 kdb devices
    """
    from kdbkit.runtime.backends.registry import binary_format_of, discover_devices, no_device_error
    from kdbkit.runtime.preflight import runtime_of
    from kdbkit.runtime.system_bundles import bundle_for_device

    rows = []
    dirs = paths.system_db_dirs()
    for index, d in enumerate(discover_devices()):  # the index --device takes
        used, trace = bundle_for_device(d.target, binary_format_of(d.backend), dirs, runtime_of(d.backend, d.runtime))
        rows.append({"index": index, "backend": d.backend, "name": d.name, "target": str(d.target),
                     "cu": d.target.cu, "memory_bytes": d.memory_bytes, "driver": d.driver, "runtime": d.runtime,
                     "bundle": str(used.path) if used else None, "wanted": d.target.built_bundle_name(),
                     "rejected": [{"path": str(c.path), "reason": c.reason} for c in trace if c.status == "rejected"]})
    if as_json:
        print_json(rows)
        return
    if not rows:
        raise no_device_error()
    table = Table(title="devices")
    for col in ("#", "backend", "name", "target", "memory", "system bundle"):
        table.add_column(col, overflow="fold")
    for r in rows:
        bundle = r["bundle"] or f"[yellow]missing {r['wanted']}[/]"
        table.add_row(str(r["index"]), r["backend"], escape(r["name"]), r["target"], size(r["memory_bytes"]), bundle)
    out.print(table)
    for r in rows:
        for rej in r["rejected"]:
            out.print(f"[yellow]not used:[/] {escape(rej['path'])}: {escape(rej['reason'])}")
