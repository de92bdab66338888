"""``kdb package`` (bundles and tuned find-dbs into kernel wheels) and ``kdb install`` (the
right package or bundle for each local GPU, verified, then installed): packager/wheel.py,
select.py and install.py do the work; this is their command line."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import err, out, print_json

_RANKS = {0: "exact target", 1: "arch-wide", 2: "arch-wide bundle (its find-db is for another CU count)"}


def package(
    bundles: List[Path] = typer.Argument(..., help="Bundles (.kdb) to package, as `kdb build` wrote them.",
                                         show_default=False),
    find_db: List[Path] = typer.Option([], "--find-db", help="A system find-db (<arch>_<cu>.fdb, as `kdb tune` "
                                       "writes it) to ship with the bundle of its arch. Repeatable."),
    output: Path = typer.Option(Path("."), "-o", "--out", help="Folder for the wheels and SHA256SUMS (created)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Turn bundles (and tuned find-dbs) into pip-installable kernel wheels, kdbkit-kernels-<arch>[-<cu>].

    Example: kdb package sm_90_132.kdb -o wheels
    """
    from kdbkit.kdb import open_bundle
    from kdbkit.packager.install import write_sums
    from kdbkit.packager.wheel import write_package
    from kdbkit.packager.errors import PackageError

    pairs: list[tuple[Path, Path | None]] = []
    unused = list(find_db)
    for bundle in bundles:
        with open_bundle(bundle) as opened:
            target = opened.metadata.target
        mine = [fdb for fdb in find_db if target is not None and _fits(target, fdb)]
        pairs += [(bundle, fdb) for fdb in mine] or [(bundle, None)]
        unused = [f for f in unused if f not in mine]
    if unused:
        raise PackageError(f"{unused[0]} fits none of the bundles given (a find-db ships with a bundle of its arch)",
                           "give the bundle it was tuned for, or leave it out")
    wheels = [write_package(bundle, output, find_db=fdb) for bundle, fdb in pairs]
    sums = write_sums(output, wheels)
    if as_json:
        print_json({"wheels": [str(w) for w in wheels], "sums": str(sums)})
        return
    for wheel, (bundle, fdb) in zip(wheels, pairs):
        out.print(f"{escape(str(wheel))}  ({escape(bundle.name)}{' + ' + escape(fdb.name) if fdb else ''})")
    out.print(f"SHA-256 of each: {escape(str(sums))}")


def _fits(target, find_db: Path) -> bool:
    from kdbkit.packager.wheel import package_target
    from kdbkit.packager.errors import PackageError

    try:
        package_target(target, find_db)
        return True
    except PackageError:
        return False


def install(
    source: Path = typer.Option(..., "--from", help="A folder of kernel wheels or bundles (.whl, .kdb), or a local "
                                "package index; searched recursively.", show_default=False),
    target: List[str] = typer.Option([], "--target", help="Install for this target (sm_90_132, gfx942_304) "
                                     "instead of the local GPUs. Repeatable."),
    gpu: List[str] = typer.Option([], "--gpu", help="Install for a GPU by name (kdb targets lists them). Repeatable."),
    explain: bool = typer.Option(False, "--explain", help="Also say why each other candidate was not taken."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Choose and verify, but install nothing."),
    into: Optional[Path] = typer.Option(None, "--into", help="Folder for bare bundles (default: this environment's "
                                        "share/kdbkit/db, which the runtime searches). Wheels go through pip."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Install the best kernel package or bundle for each local GPU (exact target, else arch-wide), verified first.

    Example: kdb install --from . --target sm_90_132 --dry-run --explain
    """
    from kdbkit.kdb import Target
    from kdbkit.packager import install as installer
    from kdbkit.packager.select import choose, scan
    from kdbkit.packager.targets import find_gpu
    from kdbkit.packager.errors import PackageError

    if not source.is_dir():
        raise PackageError(f"{source} is not a folder", "give --from the folder holding the wheels or bundles")
    named = [Target.parse(t) for t in target] + [find_gpu(g).target for g in gpu]
    devices = list(dict.fromkeys(named or _local_targets()))
    if not devices:
        raise PackageError("no GPU or OpenCL device found here",
                           "name the GPU to install for with --target or --gpu (kdb targets lists them)")
    candidates = scan(source)
    choices = [choose(device, candidates) for device in devices]
    chosen = list(dict.fromkeys(c.chosen for c in choices if c.chosen is not None))
    for candidate in chosen:  # every check before anything is installed
        installer.verify(candidate)
    installed = {c: (None if dry_run else installer.install(c, db_dir=into)) for c in chosen}
    report = [{
        "device": str(c.device), "chosen": str(c.chosen.path) if c.chosen else None,
        "why": _RANKS[c.rank] if c.chosen else "nothing fits",
        "installed": (None if c.chosen is None or dry_run else installed[c.chosen].where),
        "rejected": [{"candidate": str(r.path), "reason": reason} for r, reason in c.rejected],
    } for c in choices]
    if as_json:
        print_json({"dry_run": dry_run, "devices": report})
    else:
        _print(report, dry_run, explain, source)
    if not chosen or (named and any(c.chosen is None for c in choices)):
        raise typer.Exit(1)


def _local_targets():
    from kdbkit.runtime.backends.registry import discover_devices

    return [d.target for d in discover_devices()]


def _print(report: list[dict], dry_run: bool, explain: bool, source: Path) -> None:
    table = Table(title=f"kernel packages in {source}" + (" (dry run: nothing installed)" if dry_run else ""))
    for col in ("device target", "chosen", "because", "installed"):
        table.add_column(col, overflow="fold")
    for row in report:
        chosen = Path(row["chosen"]).name if row["chosen"] else "[yellow]none[/]"
        done = "-" if row["chosen"] is None else "would install" if dry_run else row["installed"]
        table.add_row(row["device"], chosen, row["why"], escape(str(done)))
    out.print(table)
    for row in report:
        if row["chosen"] is None and row["rejected"] and not explain:
            err.print(f"{row['device']}: {len(row['rejected'])} candidates rejected; --explain says why")
        if explain:
            for r in row["rejected"]:
                out.print(f"{row['device']}: not {escape(Path(r['candidate']).name)}: {escape(r['reason'])}")
