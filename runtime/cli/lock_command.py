"""``kdb lock`` (write ``kdbkit.lock`` for the kernel packages installed here) and the ``--locked``
halves of ``kdb install`` and ``kdb doctor``: :mod:`kdbkit.packager.lock` does the work; this is
their command line."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from kdbkit.runtime.cli.output import out, print_json


def lock(
    output: Path = typer.Option(Path("kdbkit.lock"), "-o", "--out", help="The lock file to write (replaced whole)."),
    source: Optional[Path] = typer.Option(None, "--from", help="A folder of kernel wheels: for a package whose "
                                          "installation recorded no wheel SHA-256 (installed by an older pip), the "
                                          "wheel there of its name and version with the installed files is hashed.",
                                          show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Write kdbkit.lock: each installed kernel package's name, version, target, wheel SHA-256, bundle and
    find-db SHA-256, kdbkit range and kernel-source digests (sorted, no timestamps: the same environment
    gives the same bytes).

    Example: kdb lock -o kdbkit.lock
    """
    from kdbkit.packager.lock import lock_environment
    from kdbkit.packager.lock_file import write_lock

    locked = lock_environment(from_dir=source)
    write_lock(locked, output)
    if as_json:
        print_json({"lock": str(output), "packages": [f"{p.name}=={p.version}" for p in locked.packages]})
        return
    for p in locked.packages:
        out.print(f"{escape(p.label)}  {p.target}  wheel sha256 {p.wheel_sha256}")
    out.print(f"{len(locked.packages)} kernel package(s) locked in {escape(str(output))}")


def install_locked(lock_path: Path, source: Path, dry_run: bool, as_json: bool, trusted_keys=None) -> None:
    """``kdb install --locked LOCK --from DIR``."""
    from kdbkit.packager.lock import install_locked as install
    from kdbkit.packager.lock_file import read_lock

    done = install(read_lock(lock_path), source, dry_run=dry_run, trusted_keys=trusted_keys)
    if as_json:
        print_json({"dry_run": dry_run, "installed": [] if dry_run else [str(w) for _, w in done],
                    "locked": [{"package": p.name, "version": p.version, "wheel": str(w)} for p, w in done]})
        return
    verb = "would install" if dry_run else "installed"
    for p, wheel in done:
        out.print(f"{verb} {escape(p.label)} from {escape(str(wheel))} (sha256 {p.wheel_sha256})")
    if not done:
        out.print(f"{escape(str(lock_path))} locks no kernel package: nothing to install")


def doctor_locked(lock_path: Path, targets: List[str], as_json: bool) -> None:
    """``kdb doctor --locked LOCK``: one line per difference, exit 1 when there is one."""
    from kdbkit.kdb import Target
    from kdbkit.packager.lock import check_environment
    from kdbkit.packager.lock_file import read_lock

    locked = read_lock(lock_path)
    differences = check_environment(locked, targets=[Target.parse(t) for t in targets] if targets else None)
    if as_json:
        print_json({"lock": str(lock_path), "differences": differences})
    else:
        for line in differences:
            out.print(escape(line))
        if not differences:
            out.print(f"the environment matches {escape(str(lock_path))} ({len(locked.packages)} kernel package(s))")
    if differences:
        raise typer.Exit(1)
