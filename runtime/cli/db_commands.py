"""``kdb db ...``: inspect, verify, merge and extract from bundle files."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from kdbkit.kdb import merge_bundles, open_bundle, verify_bundle
from kdbkit.kdb.target import BUNDLE_SUFFIX, USER_SUFFIX
from kdbkit.kdb.verify import VerifyReport
from rich.markup import escape

from kdbkit.runtime.cli.output import err, fail, out, print_json, size

app = typer.Typer(help="Inspect and maintain kernel bundles (.kdb, .ukdb).", no_args_is_help=True)

FileArg = typer.Argument(..., help="A bundle file (.kdb or .ukdb).", show_default=False)


@app.command("ls")
def ls(file: Path = FileArg, as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """List the entries of a bundle: kernel name, options, stored and raw size.

    Example: kdb db ls sm_90_132.kdb
    """
    with open_bundle(_one_file(file, "ls")) as b:
        rows = list(b.entries())
    if as_json:
        print_json([e.__dict__ for e in rows])
        return
    table = Table(title=f"{file} ({len(rows)} entries)")
    for col, just in (("kernel", "left"), ("options", "left"), ("stored", "right"), ("raw", "right")):
        table.add_column(col, justify=just, overflow="fold")
    for e in rows:
        table.add_row(escape(e.kernel_name), escape(e.kernel_args), size(e.stored_size), size(e.raw_size))
    out.print(table)


@app.command("info")
def info(file: Path = FileArg, as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Show a bundle's metadata (target, compiler, codec, format) and its statistics.

    Example: kdb db info gfx942_304.kdb --json
    """
    path = _one_file(file, "info")
    with open_bundle(path) as b:
        md, st = b.metadata, b.stats()
    data = {
        "file": str(file), "format_version": md.format_version, "written_by": md.producer or "unknown",
        "target": str(md.target) if md.target else None, "backend": md.target.backend if md.target else None,
        "compiler": md.compiler or None, "binary_format": md.binary_format or None, "codec": md.codec,
        "hash": md.hash, "dictionary_bytes": md.dictionary_size, "created": md.created or None,
        "reproducible": md.reproducible,  # written by `kdb build --reproducible` (or with SOURCE_DATE_EPOCH)
        "entries": st.entries, "raw_bytes": st.raw_bytes, "stored_bytes": st.stored_bytes,
        "file_bytes": st.file_bytes, "ratio": round(st.ratio, 3),
        "kernel_sources": len(md.sources),  # files in its manifest (what it was built from)
    }
    statement = _package_provenance(Path(path))
    if as_json:
        import json

        print_json({**data, "provenance": json.loads(statement) if statement is not None else None})
        return
    table = Table(show_header=False, title=str(file))
    table.add_column(style="bold")
    table.add_column()
    for k, v in data.items():
        if k.endswith("_bytes"):
            v = f"{size(v)} ({v} B)"
        table.add_row(k, "-" if v is None else escape(str(v)))
    out.print(table)
    if statement is None:
        out.print("provenance: none (the bundle is not inside an installed kernel package that records one)")
        return
    from kdbkit.packager.provenance import summary

    out.print("provenance (its kernel package's provenance.intoto.json):")
    for field, value in summary(statement):
        out.print(f"  {escape(field)}: {escape(value)}")


def _package_provenance(bundle: Path) -> bytes | None:
    """The provenance statement of the installed kernel package ``bundle`` is in, or None: the
    folder's ``provenance.intoto.json``, where its ``manifest.json`` lists both with the SHA-256
    they have (a statement beside a bundle it does not describe is no provenance of it)."""
    import hashlib
    import json

    from kdbkit.packager.provenance import FILE

    folder = bundle.parent
    try:
        listed = json.loads((folder / "manifest.json").read_bytes())["files"]
        statement = (folder / FILE).read_bytes()
        for name, data in ((bundle.name, bundle.read_bytes()), (FILE, statement)):
            if hashlib.sha256(data).hexdigest() != listed[name]["sha256"]:
                return None
        return statement
    except (OSError, ValueError, KeyError, TypeError):
        return None


@app.command("verify")
def verify(files: List[Path] = typer.Argument(..., help="Bundle files to check; a folder stands for every bundle in it.",
                                             show_default=False),
           quick: bool = typer.Option(False, "--quick", help="Skip decoding every entry."),
           as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Check SQLite integrity, schema, metadata and every entry's hash; exit 1 on any problem.

    A folder (an install folder, a build's output) is checked bundle by bundle (.kdb, .ukdb).

    Example: kdb db verify sm_90_132.kdb gfx942_304.kdb
    """
    reports = []
    for f in files:
        if not f.is_dir():
            reports.append(verify_bundle(f, check_entries=not quick))
            continue
        found = _bundles_in(f)
        reports += [verify_bundle(b, check_entries=not quick) for b in found]
        if not found:  # a problem, not a silent "nothing to check"
            reports.append(VerifyReport(f, [f"{f}: a folder with no bundle files ({BUNDLE_SUFFIX}, {USER_SUFFIX})"]))
    bad = sum(not r.ok for r in reports)
    if as_json:
        print_json([{"file": str(r.path), "ok": r.ok, "entries_checked": r.entries_checked,
                     "format_version": r.format_version, "problems": r.problems} for r in reports])
    else:
        for report in reports:
            if report.ok:
                out.print(f"[green]ok[/]   {report.path} ({report.entries_checked} entries checked)")
            else:
                out.print(f"[red]FAIL[/] {report.path}")
                for p in report.problems:
                    out.print(f"     {escape(p)}", soft_wrap=True)
    if bad:
        err.print(f"{bad} of {len(reports)} bundle(s) have problems; rebuild them, or reinstall the package that "
                  "installed them")
        raise typer.Exit(1)


@app.command("merge")
def merge(out_file: Path = typer.Argument(..., metavar="OUT", help="Bundle to write.", show_default=False),
          inputs: List[Path] = typer.Argument(..., metavar="IN...", help="Bundles to merge; the first wins on conflicts.",
                                              show_default=False),
          allow_mixed_cu: bool = typer.Option(False, "--allow-mixed-cu",
                                              help="Merge one arch across CU counts into an arch-wide bundle."),
          no_dictionary: bool = typer.Option(False, "--no-dictionary", help="Do not train a zstd dictionary."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Merge bundles for one target into OUT (written atomically), dropping duplicate entries.

    Example: kdb db merge gfx90a.kdb gfx90a_104.kdb gfx90a_110.kdb --allow-mixed-cu
    """
    report = merge_bundles(out_file, list(inputs), allow_mixed_cu=allow_mixed_cu, dictionary=not no_dictionary)
    if as_json:
        print_json({"file": str(out_file), "entries": report.entries, "duplicates": report.duplicates,
                    "conflicts": [{"kernel_name": n, "kernel_args": a} for n, a in report.conflicts]})
        return
    out.print(f"wrote {out_file}: {report.entries} entries ({report.duplicates} duplicates dropped)")
    if report.conflicts:
        err.print(f"[yellow]warning:[/] {len(report.conflicts)} key(s) had different binaries; kept the first input's:")
        for name, args in report.conflicts[:10]:
            err.print(escape(f"  {name} [{args}]"))


@app.command("extract")
def extract(file: Path = FileArg,
            name: str = typer.Argument(..., help="Kernel name as `kdb db ls` shows it, e.g. activation.c.o.",
                                       show_default=False),
            args: str = typer.Option(..., "--args", help="The entry's options as `kdb db ls` shows them; the "
                                     "--kdb-key part may be left out when one entry matches the rest."),
            output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write (default: NAME).")) -> None:
    """Write one entry's binary (decoded, hash-checked) to a file.

    Example: kdb db extract sm_90_132.kdb activation.c.o --args "-DKDB_DTYPE=float -mcpu=sm_90" -o relu.cubin
    """
    with open_bundle(file) as b:
        data = b.get(name, args)
        if data is None:
            matches = [e.kernel_args for e in b.entries() if e.kernel_name == name and _same_options(e.kernel_args, args)]
            if len(matches) > 1:
                raise fail(f"{file} has {len(matches)} entries {name} with options {args}; give the whole options "
                           f"with their --kdb-key part, as `kdb db ls {file}` shows them")
            data = b.get(name, matches[0]) if matches else None
    if data is None:
        raise fail(f"{file} has no entry {name} [{args}]; list the entries with `kdb db ls {file}`")
    dest = output or Path(Path(name).name)
    dest.write_bytes(data)
    out.print(f"wrote {dest} ({size(len(data))})")


def _bundles_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (BUNDLE_SUFFIX, USER_SUFFIX) and p.is_file())


def _one_file(path: Path, command: str) -> Path:
    """``path``, or a one-line error when it is a folder: which bundles it holds and what to run."""
    if not path.is_dir():
        return path
    found = _bundles_in(path)
    if not found:
        raise fail(f"{path} is a folder with no bundle files ({BUNDLE_SUFFIX}, {USER_SUFFIX}) in it; name a bundle file")
    names = ", ".join(p.name for p in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise fail(f"{path} is a folder, not a bundle file; name one of its {len(found)} bundle(s) ({names}), "
               f"e.g. `kdb db {command} {found[0]}`, or check them all with `kdb db verify {path}`")


def _same_options(stored: str, given: str) -> bool:
    """Whether ``given`` names the entry whose options are ``stored``, ignoring order and the key part."""
    def options(text: str) -> set[str]:
        return {t for t in text.split() if not t.startswith("--kdb-key=")}

    return options(stored) == options(given)
