"""``kdb package`` (bundles and tuned find-dbs into kernel wheels) and ``kdb install`` (the
right package or bundle for each local GPU, verified, then installed): the packager's
:func:`~kdbkit.packager.package_bundles` and :func:`~kdbkit.packager.install_packages` do the
work; this is their command line."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kdbkit.runtime.cli.output import err, fail, out, print_json, size

_RANKS = {0: "exact target", 1: "arch-wide", 2: "arch-wide bundle (its find-db is for another CU count)"}


def package(
    bundles: Optional[List[Path]] = typer.Argument(None, help="Bundles (.kdb) to package, or folders of them, as "
                                                   "`kdb build` wrote them (each bundle once).", show_default=False),
    find_db: List[Path] = typer.Option([], "--find-db", help="A system find-db (<arch>_<cu>.fdb, as `kdb tune` "
                                       "writes it) to ship with the bundle of its arch. Repeatable."),
    output: Path = typer.Option(Path("."), "-o", "--out", help="Folder for the wheels and SHA256SUMS (created)."),
    sign: Optional[Path] = typer.Option(None, "--sign", help="Sign each wheel's manifest (which lists every file's "
                                        "SHA-256) with this Ed25519 private key (`kdb keys new -o DIR` makes a "
                                        "pair); `kdb install --trusted-key PUB` checks it.", show_default=False),
    max_wheel_size: str = typer.Option("1G", "--max-wheel-size", help="Split a bundle whose wheel would be larger "
                                       "into parts, each a wheel at most this size (kdbkit-kernels-<target>, then "
                                       "...-part2, ...), installed together: 512M, 1G; 0: never split. PyPI "
                                       "takes 100M a file unless raised."),
    provenance_host: bool = typer.Option(False, "--provenance-host", help="Record this machine's host name in each "
                                         "wheel's provenance (then wheels differ between machines)."),
    show: Optional[Path] = typer.Option(None, "--show", help="Print a kernel wheel's provenance and signer instead "
                                        "of packaging.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Turn bundles (and tuned find-dbs) into pip-installable kernel wheels, kdbkit-kernels-<arch>[-<cu>].

    Example: kdb package sm_90_132.kdb -o wheels --sign keys/kdb-signing.key
    """
    from kdbkit.kdb.signing import load_signer
    from kdbkit.packager import package_bundles

    if show is not None:
        if bundles:
            raise fail("--show prints one wheel's provenance; give no bundles with it", 2)
        _show(show, as_json)
        return
    if not bundles:
        raise fail("give the bundles to package (or --show WHEEL)", 2)
    from kdbkit.runtime.env import size_in_bytes

    try:
        limit = size_in_bytes(max_wheel_size)
    except ValueError as exc:
        raise fail(f"--max-wheel-size: {exc}", 2) from None
    signer = load_signer(sign) if sign is not None else None
    packaged, sums = package_bundles(bundles, output, find_dbs=find_db, signer=signer,
                                     provenance_host=provenance_host, max_wheel_bytes=limit or None)
    if as_json:
        print_json({"wheels": [str(p.wheel) for p in packaged],
                    "packages": [{"wheel": str(p.wheel), "bytes": p.size, "bundle": str(p.bundle), "part": p.part,
                                  "parts": p.parts, "find_db": str(p.find_db) if p.find_db else None}
                                 for p in packaged],
                    "max_wheel_bytes": limit or None, "sums": str(sums)})
        return
    for p in packaged:
        holds = escape(p.bundle.name) + (f", part {p.part} of {p.parts}" if p.parts > 1 else "")
        holds += " + " + escape(p.find_db.name) if p.find_db else ""
        out.print(f"{escape(str(p.wheel))}  {size(p.size)}  ({holds})")
    out.print(f"SHA-256 of each: {escape(str(sums))}")
    if signer is not None:
        out.print(f"signed with key {signer.key_id} ({escape(str(sign))})")


def _show(wheel: Path, as_json: bool) -> None:
    """``kdb package --show WHEEL``: its provenance statement and signer, read as data."""
    import json
    import zipfile

    from kdbkit.kdb.signing import read_detached_signature
    from kdbkit.packager import provenance
    from kdbkit.packager.wheel import SIGNATURE
    from kdbkit.packager.wheel_checks import MAX_TEXT_BYTES

    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [i for i in archive.infolist() if i.filename.count("/") == 1]
            found = {i.filename.split("/")[1]: i for i in names if i.file_size <= MAX_TEXT_BYTES}
            statement = archive.read(found[provenance.FILE]) if provenance.FILE in found else None
            signature = archive.read(found[SIGNATURE]) if SIGNATURE in found else None
    except (OSError, zipfile.BadZipFile) as exc:
        raise fail(f"{wheel}: not a readable wheel ({exc})") from None
    signer = read_detached_signature(signature) if signature is not None else None
    signed = (f"key {signer[0]} (check it with `kdb install --trusted-key`)" if signer else
              "not signed" if signature is None else "a malformed signature")
    if as_json:
        print_json({"wheel": str(wheel), "signed_by": signer[0] if signer else None,
                    "provenance": json.loads(statement) if statement is not None else None})
        return
    out.print(f"{escape(str(wheel))}: signed: {escape(signed)}")
    if statement is None:
        out.print("provenance: none (packaged by a kdbkit that wrote none)")
        return
    for field, value in provenance.summary(statement):
        out.print(f"  {escape(field)}: {escape(value)}")


def install(
    source: Path = typer.Option(..., "--from", help="A folder of kernel wheels or bundles (.whl, .kdb), or a local "
                                "package index; searched recursively.", show_default=False),
    locked: Optional[Path] = typer.Option(None, "--locked", help="Install exactly the packages a lock file (`kdb "
                                          "lock` wrote it) names, by name, version and wheel SHA-256, whatever the "
                                          "local GPUs; on the first difference, nothing.", show_default=False),
    target: List[str] = typer.Option([], "--target", help="Install for this target (sm_90_132, gfx942_304) "
                                     "instead of the local GPUs. Repeatable."),
    gpu: List[str] = typer.Option([], "--gpu", help="Install for a GPU by name (kdb targets lists them). Repeatable."),
    explain: bool = typer.Option(False, "--explain", help="Also say why each other candidate was not taken."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Choose and verify, but install nothing."),
    check: bool = typer.Option(False, "--check", help="Preflight: say whether each offered package would load on "
                               "these devices and drivers, and why not (a dry run with --explain; exit 1 where a "
                               "device gets none). KDB_DEVICE_RUNTIME checks for another machine's driver."),
    require_hashes: bool = typer.Option(False, "--require-hashes", help="Refuse any candidate that no SHA256SUMS "
                                        "in the folder lists (where there is one, an unlisted file is refused "
                                        "anyway)."),
    trusted_key: List[Path] = typer.Option([], "--trusted-key", help="Install only packages whose manifest one "
                                           "of these Ed25519 public keys signed (`kdb package --sign`); bare "
                                           "bundles are refused then. Repeatable."),
    into: Optional[Path] = typer.Option(None, "--into", help="Folder for bare bundles (default: this environment's "
                                        "share/kdbkit/db, which the runtime searches). Wheels go through pip."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Install the best kernel package or bundle for each local GPU (exact target, else arch-wide), verified first.

    Example: kdb install --from . --target sm_90_132 --dry-run --explain
    """
    from kdbkit.kdb.signing import load_public_keys

    trusted_keys = load_public_keys(trusted_key) if trusted_key else None
    if locked is not None:
        given = [flag for flag, on in (("--target", target), ("--gpu", gpu), ("--explain", explain),
                                       ("--require-hashes", require_hashes), ("--into", into), ("--check", check)) if on]
        if given:
            raise fail(f"--locked installs what the lock names; leave out {given[0]}", 2)
        from kdbkit.runtime.cli.lock_command import install_locked

        install_locked(locked, source, dry_run, as_json, trusted_keys)
        return
    from kdbkit.packager import install_packages

    if check:  # everything a preflight wants to know is what a dry run decides, with every reason
        dry_run = explain = True
    result = install_packages(source, targets=target, gpus=gpu, dry_run=dry_run, into=into,
                              require_hashes=require_hashes, trusted_keys=trusted_keys)
    report = [{
        "device": str(c.device), "chosen": str(c.chosen.path) if c.chosen else None,
        "parts": [str(p) for p in c.chosen.others] if c.chosen else [],  # a split package's other wheels
        "why": _RANKS[c.rank] if c.chosen else "nothing fits",
        "installed": (None if c.chosen is None or dry_run else result.installed[c.chosen].where),
        "rejected": [{"candidate": str(r.path), "reason": reason} for r, reason in c.rejected],
    } for c in result.choices]
    if as_json:
        print_json({"dry_run": dry_run, "devices": report})
    else:
        _print(report, dry_run, explain, source)
    if not result.ok:
        raise typer.Exit(1)


def _print(report: list[dict], dry_run: bool, explain: bool, source: Path) -> None:
    table = Table(title=f"kernel packages in {source}" + (" (dry run: nothing installed)" if dry_run else ""))
    for col in ("device target", "chosen", "because", "installed"):
        table.add_column(col, overflow="fold")
    for row in report:
        chosen = escape(Path(row["chosen"]).name) if row["chosen"] else "[yellow]none[/]"
        chosen += f" (and its {len(row['parts'])} other parts)" if row["parts"] else ""
        done = "-" if row["chosen"] is None else "would install" if dry_run else row["installed"]
        table.add_row(row["device"], chosen, row["why"], escape(str(done)))
    out.print(table)
    for row in report:
        if row["chosen"] is None and row["rejected"] and not explain:
            err.print(f"{row['device']}: {len(row['rejected'])} candidates rejected; --explain says why")
        if explain:
            for r in row["rejected"]:
                out.print(f"{row['device']}: not {escape(Path(r['candidate']).name)}: {escape(r['reason'])}")
