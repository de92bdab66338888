"""``kdb driver <primitive>``: MIOpenDriver's equivalent, one command per driver spec.

Each command is built from its spec's flags (runtime/driver/spec.py): every option is
declared with a None default so that a flag given can be told from one left out (``--config``
refuses problem flags beside it), and defaults are applied when the values are resolved. A bad
value is a usage error (one line, exit 2); a verification that fails exits 1.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from kdbkit.runtime.driver import registry
from kdbkit.runtime.driver.spec import SHAPE, DriverSpec, Flag
from kdbkit.runtime.errors import ProblemError


class _DriverGroup(TyperGroup):
    """Answers MIOpenDriver's typed names too: ``activfp16`` is ``activ --dtype fp16``."""

    def resolve_command(self, ctx, args):
        if args:
            target = registry.aliases().get(args[0])
            if target is not None:
                command, dtype = target
                args = [command, *(["--dtype", dtype] if dtype else []), *args[1:]]
        return super().resolve_command(ctx, args)


def _alias_help() -> str:
    others = ", ".join(f"{name} ({spec.command})" for spec in registry.specs() for name in spec.aliases)
    return ("Run a primitive as MIOpenDriver does: random inputs, verification against the NumPy reference "
            "(-V), device-event timing (-t). MIOpenDriver's typed names work too: activfp16, softmaxbfp16, ... "
            f"(the command with --dtype fp16 or bf16){'; and ' + others if others else ''}.")


app = typer.Typer(name="driver", cls=_DriverGroup, no_args_is_help=True, help=_alias_help(), add_completion=False)


class _Usage(typer.BadParameter):
    """A usage error (exit 2, one line): click's wording for a flag's value, the message alone otherwise."""

    def format_message(self) -> str:
        return super().format_message() if self.param_hint else self.message


def _usage(ctx: Any, message: str, hint: str | None = None) -> typer.BadParameter:
    return _Usage(message, ctx=ctx, param_hint=hint)


def _check_solver(ctx: Any, spec: DriverSpec, solver: str | None) -> None:
    """-S names a solver of this primitive (whether it applies is the run's to say)."""
    from kdbkit.runtime.primitives import load_all
    from kdbkit.runtime.solver import REGISTRY

    if solver is None or solver.strip() in ("0", "-1"):
        return
    load_all()
    found = REGISTRY.find(solver.strip())
    if found is None or found.primitive != spec.primitive:
        names = ", ".join(f"{s.id} {s.name}" for s in REGISTRY.for_primitive(spec.primitive))
        raise _usage(ctx, f"{solver!r} is not a {spec.primitive} solver; use -1 (find), 0 (immediate) or one "
                          f"of: {names}", "-S")


def _resolve(ctx: Any, spec: DriverSpec, given: dict[str, Any]) -> SimpleNamespace:
    """Flag values with defaults applied and checked; a bad one is a usage error."""
    values = {}
    for flag in spec.all_flags():
        value = given.get(flag.dest)
        if value is not None:
            if flag.choices is not None and value not in flag.choices:
                raise _usage(ctx, f"{value!r} is not one of {', '.join(map(str, flag.choices))}", flag.decls[0])
            if flag.minimum is not None and value < flag.minimum:
                raise _usage(ctx, f"{value} is below {flag.minimum}", flag.decls[0])
        values[flag.dest] = flag.default if value is None else value
    _check_solver(ctx, spec, values["solver"])
    if spec.shape_flags:
        values["shape"] = (values["n"], values["c"], values["h"], values["w"])
    if values.get("input") is not None:  # pool's --input NxCxHxW stands for -n -c -H -W
        clash = [f.decls[0] for f in SHAPE if given.get(f.dest) is not None]
        if clash:
            raise _usage(ctx, f"--input gives the whole shape: drop {', '.join(clash)}", "--input")
        parts = values["input"].lower().split("x")
        if len(parts) != 4 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise _usage(ctx, f"{values['input']!r} is not four sizes of at least 1 as NxCxHxW (e.g. 32x64x112x112)",
                         "--input")
        values["shape"] = tuple(int(p) for p in parts)
    return SimpleNamespace(**values)


def _problems(ctx: Any, spec: DriverSpec, given: dict[str, Any], o: SimpleNamespace) -> list:
    from kdbkit.runtime.problem import parse_config

    try:
        if o.config is None:
            return spec.problems(o)
        clash = [f.decls[0] for f in spec.all_flags() if f.problem and given.get(f.dest) is not None]
        if clash:
            raise _usage(ctx, f"{', '.join(clash)} cannot be combined with --config, which names the whole problem")
        problem = parse_config(o.config)
        if problem.primitive != spec.primitive:
            owner = registry.for_primitive(problem.primitive)
            raise _usage(ctx, f"the config names a {problem.primitive} problem and `kdb driver {spec.command}` runs "
                         f"{spec.primitive} ones" + (f": run `kdb driver {owner.command}`" if owner else ""),
                         "--config")
        return spec.config_problems(problem, given.get("forw"))
    except ProblemError as exc:  # a bad value in the flags or the config
        raise _usage(ctx, f"{exc.problem}; {exc.remedy}" if exc.remedy else exc.problem) from None
    except ValueError as exc:  # -F against the config's direction
        raise _usage(ctx, str(exc)) from None


def _run(ctx: Any, spec: DriverSpec, given: dict[str, Any]) -> None:
    from kdbkit.runtime.backends.registry import pick_device
    from kdbkit.runtime.driver import lines
    from kdbkit.runtime.driver.run import run_problem
    from kdbkit.runtime.handle import Handle

    o = _resolve(ctx, spec, given)
    problems = _problems(ctx, spec, given, o)
    failed = 0
    with Handle(pick_device(o.device)) as handle:
        typer.echo(lines.device(handle.device.name, handle.target))
        for problem in problems:
            failed += not run_problem(handle, spec, problem, o, typer.echo).ok
    if failed:
        raise typer.Exit(1)


def problems_of_command(words: list[str]) -> list:
    """The problems a driver command names, parsed as ``kdb driver`` parses it and not run: the
    words after ``kdb driver`` or ``MIOpenDriver`` (``conv -n 32 ...``, ``convfp16 ...``). What
    the offline builder reads from the lines ``KDB_ENABLE_LOGGING_CMD=1`` and MIOpen log.

    Raises:
        ProblemError: the command does not parse; the message says why, as ``kdb driver`` would.
    """
    from typer.exceptions import TyperException  # the base of what typer's parsers raise

    if not words:
        raise ProblemError("a driver command names no primitive", "start it with one: conv, convfp16, softmax, ...")
    group = typer.main.get_command(app)
    try:
        ctx = group.make_context("driver", list(words))
        name, command, args = group.resolve_command(ctx, [*getattr(ctx, "_protected_args", []), *ctx.args])
        sub = command.make_context(name, args, parent=ctx)
        spec = next(s for s in registry.specs() if s.command == name)
        return _problems(sub, spec, sub.params, _resolve(sub, spec, sub.params))
    except TyperException as exc:  # bad values, unknown options and commands
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise ProblemError(f"driver command {' '.join(words)!r}: {message}",
                           "write it as `kdb driver --help` shows") from None


def _help(spec: DriverSpec) -> str:
    shape = ("Shape: -n -c -H -W (N C H W), by default 4 8 16 16: small, for CPUs (MIOpenDriver's are "
             "larger). " if spec.shape_flags else "")
    return (f"{spec.summary}\n\n{shape}Prints the problem's config string, the solver and how it was chosen, "
            "the GPU kernel time (-t 1) and whether the outputs verify against the NumPy reference (-V 1, "
            "exit 1 when not).\n\n"
            f"Example: {spec.example}")


def _command(spec: DriverSpec):
    """A typer command whose options are ``spec``'s flags."""

    def command(ctx: typer.Context, **given: Any) -> None:
        _run(ctx, spec, given)

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    for flag in spec.all_flags():
        params.append(inspect.Parameter(flag.dest, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[flag.kind],
                                        default=typer.Option(None, *flag.decls, help=_flag_help(flag),
                                                             show_default=False)))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    command.__name__ = command.__qualname__ = f"driver_{spec.command}"
    command.__doc__ = _help(spec)
    return command


def _flag_help(flag: Flag) -> str:
    return flag.help if flag.default is None else f"{flag.help} Default: {flag.default}."


for _spec in registry.specs():
    app.command(_spec.command, help=_help(_spec))(_command(_spec))
