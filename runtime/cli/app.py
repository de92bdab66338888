"""The ``kdb`` entry point: assembles the sub-commands and turns errors into one line.

Every kdbkit error (``KdbError``) and operating-system error reaches the user as one line
naming the file or key and the remedy, with exit code 1 (2 for usage errors, as click
does); a traceback appears only with ``KDB_CLI_TRACEBACK=1``.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.version import __version__
from kdbkit.runtime.cli import cache_commands, db_commands
from kdbkit.runtime.cli.demo_command import demo
from kdbkit.runtime.cli.doctor_command import doctor
from kdbkit.runtime.cli.env_command import env
from kdbkit.runtime.cli.runtime_commands import devices, resolve
from kdbkit.runtime.cli.output import err

app = typer.Typer(
    name="kdb",
    help="kdbkit: precompiled GPU kernel bundles (.kdb), their caches, and a runtime that uses them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(db_commands.app, name="db")
app.add_typer(cache_commands.app, name="cache")
app.command("env")(env)
app.command("resolve")(resolve)
app.command("devices")(devices)
app.command("doctor")(doctor)
app.command("demo")(demo)


def version_string() -> str:
    return __version__


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kdbkit {version_string()}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the kdbkit version and exit.")) -> None:
    """kdbkit: precompiled GPU kernel bundles (.kdb), their caches, and a runtime that uses them."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; the console script ``kdb`` calls this.

    click's standalone mode handles usage errors (exit 2) and ``typer.Exit``; what is left
    to catch here are kdbkit's own errors and OS errors, each shown as one line.
    """
    try:
        app(args=argv, prog_name="kdb")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KdbError as exc:
        return _one_line(exc)
    except OSError as exc:
        return _one_line(exc, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    return 0


def _one_line(exc: BaseException, text: str | None = None) -> int:
    if os.environ.get("KDB_CLI_TRACEBACK"):
        raise exc
    err.print("[bold red]error:[/] " + escape(str(text or exc)), soft_wrap=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
