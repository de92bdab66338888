"""``kdb cache ...``: the user kernel cache (.ukdb files)."""

from __future__ import annotations

import os
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime import cache_admin, env, paths
from kdbkit.runtime.cli.output import out, print_json, size
from kdbkit.runtime.user_cache import LOCKS

app = typer.Typer(help="Inspect and maintain the user kernel cache (.ukdb).", no_args_is_help=True)


@app.command("ls")
def ls(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List the cache files: arch, compiler, entries and size.

    Example: KDB_CUSTOM_CACHE_DIR=/scratch/kdb kdb cache ls
    """
    files = cache_admin.list_cache()
    if as_json:
        print_json([f.__dict__ for f in files])
        return
    table = Table(title=f"user kernel cache: {paths.user_cache_dir()}")
    for col in ("file", "target", "compiler", "entries", "size", "problem"):
        table.add_column(col, overflow="fold")
    for f in files:
        table.add_row(f.path.name, f.target or "-", escape(f.compiler or "-"),
                      "-" if f.entries is None else str(f.entries), size(f.file_bytes), escape(f.problem or ""))
    out.print(table if files else f"no cache files in {paths.user_cache_dir()}")


@app.command("stats")
def stats(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Totals for the cache folder: files, entries, bytes on disk and raw, and the size limit.

    Example: kdb cache stats --json
    """
    files = cache_admin.list_cache()
    folder = paths.user_cache_dir()
    locks = folder / LOCKS
    data = {
        "folder": str(folder), "files": len(files), "entries": sum(f.entries or 0 for f in files),
        "file_bytes": sum(f.file_bytes for f in files), "raw_bytes": sum(f.raw_bytes or 0 for f in files),
        "lock_files": len(list(locks.glob("*.lock"))) if os.path.isdir(locks) else 0,
        # each file is kept under it (KDB_CACHE_MAXSIZE; 0: no limit), least recently used first
        "max_bytes_per_file": env.get_size("KDB_CACHE_MAXSIZE"),
        "damaged_files": [str(f.path) for f in files if f.problem],
    }
    if as_json:
        print_json(data)
        return
    for k, v in data.items():
        shown = "no limit" if k == "max_bytes_per_file" and not v else size(v) if "_bytes" in k else v
        out.print(f"{k:18} {shown}")


@app.command("clear")
def clear(yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Empty the cache of this kdbkit version (programs will be compiled again), and remove
    damaged user find-db files (good rankings are kept).

    Safe while other processes use the cache: they keep running and compile what they need.

    Example: kdb cache clear --yes
    """
    folder = paths.user_cache_dir()
    if not yes and not typer.confirm(f"Delete the kernel cache in {folder}?"):
        raise typer.Exit(1)
    report = cache_admin.clear_cache(folder, find_db_folder=paths.user_db_dir())
    if as_json:
        print_json({"folder": str(folder), "entries": report.entries, "removed_files": report.removed_files,
                    "busy_locks": report.busy_locks, "freed_bytes": report.freed_bytes})
        return
    out.print(f"removed {report.entries} entr(ies) and {len(report.removed_files)} file(s) from {folder}"
              + (f"; {report.busy_locks} lock(s) in use were kept" if report.busy_locks else ""))


def _lock_age_days(days: Optional[float]) -> Optional[float]:
    # click's range check lets nan through in some versions (every comparison with nan is false)
    if days is not None and not days >= 0:
        raise typer.BadParameter(f"{days} is not a number of days: give 0 or more")
    return days


@app.command("prune")
def prune(lock_days: Optional[float] = typer.Option(7.0, "--lock-days", callback=_lock_age_days,
                                                   help="Remove lock files idle this many days (0: every idle one)."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Remove what this version cannot use: other versions' caches, damaged files and entries, old locks.

    Example: kdb cache prune --lock-days 1
    """
    report = cache_admin.prune_cache(lock_age_s=(lock_days or 0) * 86400, find_db_folder=paths.user_db_dir())
    if as_json:
        print_json({"removed_files": report.removed_files, "removed_entries": report.removed_entries,
                    "freed_bytes": report.freed_bytes})
        return
    out.print(f"removed {len(report.removed_files)} file(s) and {report.removed_entries} damaged entr(ies), "
              f"freed {size(report.freed_bytes)}")
