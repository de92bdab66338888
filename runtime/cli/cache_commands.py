"""``kdb cache ...``: the user kernel cache (.ukdb files)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import cache_admin, env, paths, remote_admin, tier_stats
from kdbkit.runtime.cli.output import err, fail, out, print_json, size
from kdbkit.runtime.user_cache import LOCKS

app = typer.Typer(help="Inspect, maintain and export the user kernel cache (.ukdb).", no_args_is_help=True)


@app.command("ls")
def ls(remote: bool = typer.Option(False, "--remote", help="List the cluster cache (KDB_REMOTE_CACHE) instead."),
       as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List the cache files: arch, compiler, entries and size (--remote: the cluster cache's entries).

    Example: KDB_CUSTOM_CACHE_DIR=/scratch/kdb kdb cache ls
    """
    if remote:
        _ls_remote(as_json)
        return
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


def _ls_remote(as_json: bool) -> None:
    link = remote_admin.link()
    try:
        listing = remote_admin.list_remote(link)
    finally:
        link.close()
    if as_json:
        print_json(listing.__dict__)
        return
    out.print(f"cluster cache {escape(listing.where)}")
    for kind, count in listing.counts.items():
        out.print(f"  {kind:15} {count:8}  {size(listing.bytes[kind])}")
    for name, nbytes in listing.sample:
        out.print(f"  {escape(name)}  {size(nbytes)}")


@app.command("stats")
def stats(reset: bool = typer.Option(False, "--reset", help="Start the tiers' counts anew."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Totals for the cache folder (files, entries, bytes on disk and raw, the size limit), how
    each tier served this user's processes (hits, misses, puts, refusals, errors, latency
    percentiles), and the cluster cache's server memory and eviction policy where one is set.

    Example: kdb cache stats --json
    """
    files = cache_admin.list_cache()
    folder = paths.user_cache_dir()
    if reset:
        tier_stats.reset(folder)
    locks = folder / LOCKS
    tiers, since = tier_stats.load(folder)
    data = {
        "folder": str(folder), "files": len(files), "entries": sum(f.entries or 0 for f in files),
        "file_bytes": sum(f.file_bytes for f in files), "raw_bytes": sum(f.raw_bytes or 0 for f in files),
        "lock_files": len(list(locks.glob("*.lock"))) if os.path.isdir(locks) else 0,
        # each file is kept under it (KDB_CACHE_MAXSIZE; 0: no limit), least recently used first
        "max_bytes_per_file": env.get_size("KDB_CACHE_MAXSIZE"),
        "damaged_files": [str(f.path) for f in files if f.problem],
        "tiers_since": since, "tiers": {name: t.as_dict() for name, t in sorted(tiers.items())},
    }
    if env.get_str("KDB_REMOTE_CACHE"):
        data["remote"] = _remote_summary()
    if as_json:
        print_json(data)
        return
    for k, v in data.items():
        if k in ("tiers", "tiers_since", "remote"):
            continue
        shown = "no limit" if k == "max_bytes_per_file" and not v else size(v) if "_bytes" in k else v
        out.print(f"{k:18} {shown}")
    out.print(_tier_table(data["tiers"], since) if data["tiers"] else "tiers              nothing counted yet")
    for k, v in data.get("remote", {}).items():
        out.print(f"remote {k:11} {size(v) if isinstance(v, int) and 'memory' in k else escape(str(v))}")


def _tier_table(tiers: dict, since: float | None) -> Table:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(since)) if since else "?"
    table = Table(title=f"how each tier served (processes since {when})")
    columns = ("hits", "misses", "puts", "refusals", "errors", "compiles", "p50_ms", "p90_ms", "p99_ms")
    table.add_column("tier")
    for col in columns:
        table.add_column(col, justify="right")
    for name, row in tiers.items():
        table.add_row(name, *("-" if row[c] is None else f"{row[c]:.3g}" if c.endswith("_ms") else str(row[c])
                              for c in columns))
    return table


def _remote_summary() -> dict:
    try:
        link = remote_admin.link()
    except KdbError as exc:  # not reachable, not a URL, a password file that cannot be used
        return {"error": exc.problem}
    try:
        counts = remote_admin.count_remote(link)
        return {"where": link.where, "programs": counts["programs"], "rankings": counts["rankings"],
                **remote_admin.server_memory(link)}
    except KdbError as exc:
        return {"where": link.where, "error": exc.problem}
    finally:
        link.close()


@app.command("clear")
def clear(yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
          remote: bool = typer.Option(False, "--remote", help="Empty the cluster cache (KDB_REMOTE_CACHE) instead: "
                                      "needs a Redis user that may write."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Empty the cache of this kdbkit version (programs will be compiled again), and remove
    damaged user find-db files (good rankings are kept).

    Safe while other processes use the cache: they keep running and compile what they need.

    Example: kdb cache clear --yes
    """
    if remote:
        _clear_remote(yes, as_json)
        return
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


def _clear_remote(yes: bool, as_json: bool) -> None:
    link = remote_admin.link()
    try:
        if not yes and not typer.confirm(f"Delete every program and ranking in the cluster cache {link.where}?"):
            raise typer.Exit(1)
        removed = remote_admin.clear_remote(link)
    finally:
        link.close()
    if as_json:
        print_json({"where": link.where, "removed": removed})
        return
    out.print(f"removed {removed} entr(ies) from the cluster cache {escape(link.where)}")


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


@app.command("export")
def export(output: Path = typer.Option(..., "-o", "--out", help="Folder for <arch>.kdb and <arch>_<cu>.fdb (made "
                                       "if missing; refused if it holds files, unless --force).", show_default=False),
           target: List[str] = typer.Option([], "--target", help="Export this cached target only (ocl-3f9a1c2b7d10_2, "
                                            "sm_90, gfx942_304); with a CU count, only that device's find-db. "
                                            "Repeatable; default: every cached target."),
           force: bool = typer.Option(False, "--force", help="Write into a folder that holds files, replacing those "
                                      "this export writes (others are left as they are)."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts, listing each skipped entry.")
           ) -> None:
    """Turn the user cache and find-db into a bundle and find-db per target, for `kdb package`:
    run the job once with the JIT, export, package, install everywhere.

    Only entries whose key still matches the kernel sources (KDB_KERNEL_PATH, then kdbkit's) are
    exported; edited sources, other compilers' entries (a bundle records the compiler with most
    entries) and damaged entries are skipped, counted by reason. The cluster cache
    (KDB_REMOTE_CACHE) is keyed by digest alone, with no index of names and options: its
    programs are exported only once a hit wrote them through to this user cache, as on any node
    that ran the job.

    Example: kdb cache export -o exported
    """
    from kdbkit.runtime.cache_export import REASONS, REMOTE_NOTE, export_cache

    report = export_cache(output, target, force=force)
    if as_json:
        print_json(report.as_dict())
    else:
        _print_export(report, REASONS, REMOTE_NOTE)
    if not report.bundles:
        raise fail(f"nothing exported to {output}: every entry of the cache was skipped "
                   f"({', '.join(f'{n} {r}' for r, n in report.counts.items()) or 'it holds none'})")


def _print_export(report, reasons: dict[str, str], remote_note: str) -> None:
    for t in report.targets:
        if t.bundle is None:
            out.print(f"{t.target}: nothing exported from {escape(t.cache_file.name)}")
            continue
        line = f"{t.target}: {t.programs} program(s) -> {escape(str(t.bundle))} (compiler {escape(t.compiler)})"
        if t.find_dbs:
            line += f"; {t.rankings} ranking(s) -> {', '.join(escape(str(p)) for p in t.find_dbs)}"
        out.print(line)
        if len(t.by_compiler) > 1:
            others = ", ".join(f"{escape(c)} ({n})" for c, n in t.by_compiler.items() if c != t.compiler)
            out.print(f"  its cache holds entries of {len(t.by_compiler)} compilers: exported the one with most, "
                      f"skipped {others}")
    counts = report.counts
    if counts:
        out.print(f"skipped {sum(counts.values())} (--json lists each):")
        for reason, n in counts.items():
            out.print(f"  {n:5} {reason}: {escape(reasons[reason])}")
    if env.get_str("KDB_REMOTE_CACHE"):
        err.print(f"note: {escape(remote_note)}")
    if report.bundles:
        find_dbs = " ".join(f"--find-db {escape(str(p))}" for t in report.targets for p in t.find_dbs)
        bundles = " ".join(escape(str(p)) for p in report.bundles)
        out.print(f"next: kdb package {bundles}{' ' + find_dbs if find_dbs else ''} -o wheels")
