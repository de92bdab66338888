"""The ``kdb`` entry point: assembles the sub-commands and turns errors into one line.

Every kdbkit error (``KdbError``) and operating-system error reaches the user as one line
naming the file or key and the remedy, with exit code 1 (2 for usage errors, as click
does); a compile error's log follows its line. Anything else is a bug in kdbkit: it too is
one line, saying how to get the traceback (``KDB_CLI_TRACEBACK=1``) to report it.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.version import __version__
from kdbkit.runtime import env as kdb_env
from kdbkit.runtime.errors import CompileError
from kdbkit.runtime.cli import cache_commands, db_commands, interrupts, key_commands
from kdbkit.runtime.cli.demo_command import demo
from kdbkit.runtime.driver import commands as driver_commands
from kdbkit.runtime.cli.doctor_command import doctor
from kdbkit.runtime.cli.env_command import env
from kdbkit.runtime.cli.runtime_commands import devices, resolve
from kdbkit.runtime.cli.targets_command import targets
from kdbkit.runtime.cli.build_command import build
from kdbkit.runtime.cli.package_commands import install, package
from kdbkit.runtime.cli.lock_command import lock
from kdbkit.runtime.cli.tune_command import tune
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
app.add_typer(driver_commands.app, name="driver")
app.add_typer(key_commands.app, name="keys")
app.command("env")(env)
app.command("resolve")(resolve)
app.command("devices")(devices)
app.command("targets")(targets)
app.command("build")(build)
app.command("package")(package)
app.command("install")(install)
app.command("lock")(lock)
app.command("tune")(tune)
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
    """Run the CLI; the console script ``kdb`` calls this. Returns the exit status.

    Every failure is one line: kdbkit's errors (1, with a compile error's log below), OS
    errors (1), usage errors such as an unknown option (2), a group named without a command
    (its help, once, and 2 as typer gives), anything else as an internal error (1) that says
    how to get the traceback; Ctrl-C "aborted" (130), a second one exits at once
    (:mod:`.interrupts`).
    """
    with interrupts.handled():
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    try:
        # Not standalone: click would print usage errors as a boxed panel; they are one line here.
        code = command().main(args=argv, prog_name="kdb", standalone_mode=False)
        if interrupts.interrupted():  # typer answers Ctrl-C with a silent exit 130
            err.print("aborted")
            return interrupts.EXIT_INTERRUPTED
        return code if isinstance(code, int) else 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        err.print("aborted")
        return interrupts.EXIT_INTERRUPTED
    except KdbError as exc:
        return _one_line(exc, f"{exc.problem}; {exc.remedy}" if exc.remedy else exc.problem,
                         exc.log if isinstance(exc, CompileError) else "")
    except OSError as exc:
        return _one_line(exc, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
    except Exception as exc:
        kind = _click_kind(exc)
        if kind == "help":  # `kdb db` alone: the group's help, once, and exit 2 as typer's standalone mode does
            # Making the exception rendered the help: rich printed it already and left the message
            # empty; plain click returned it as the message.
            if exc.format_message().strip():
                typer.echo(exc.format_message())
            return 2
        if kind == "usage":
            where = exc.ctx.command_path if exc.ctx else "kdb"
            err.print(f"[bold red]error:[/] {escape(exc.format_message())} (see `{where} --help`)", soft_wrap=True)
            return 2
        if kind == "abort":
            err.print("aborted")
            return 1
        # a bug in kdbkit: still one line, and how to see more
        return _one_line(exc, f"internal error ({type(exc).__name__}: {exc}); rerun with KDB_CLI_TRACEBACK=1 "
                              "and report the traceback")


def command():
    """The click command tree of ``kdb``, with flags shown as flags in ``--help``.

    typer's rich help prints every option's type, flags included (``--json <bool>``), as if
    they took a value; an empty metavar leaves a flag's type column blank. The help option is
    made on first use, so it is made here to be blanked too.
    """
    root = typer.main.get_command(app)
    stack = [root]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        help_option = cmd.get_help_option(cmd.context_class(cmd, info_name=cmd.name))
        for param in [*cmd.params, *([help_option] if help_option else [])]:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
    return root


def _click_kind(exc: Exception) -> str | None:
    """What a click exception is, by class name: typer 0.29 and later raise those of its own copy of click."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    for name, kind in (("NoArgsIsHelpError", "help"), ("UsageError", "usage"), ("Abort", "abort")):
        if name in names:
            return kind
    return None


def _one_line(exc: BaseException, text: str, log: str = "") -> int:
    if kdb_env.get_bool("KDB_CLI_TRACEBACK"):
        raise exc
    err.print("[bold red]error:[/] " + escape(" ".join(text.split("\n"))), soft_wrap=True)
    if log:
        err.print(escape(log.rstrip()), soft_wrap=True, style="dim")
    return 1


if __name__ == "__main__":
    sys.exit(main())
