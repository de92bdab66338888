"""The driver's commands, found; and the command line that reproduces a problem (KDB_ENABLE_LOGGING_CMD).

A ``kdb driver`` command is a module that defines ``SPEC``, an instance of its
:class:`~kdbkit.runtime.driver.spec.DriverSpec` subclass: every such module of this package
(kdbkit's primitives), then the ``driver`` module of each primitive an entry point adds
(:data:`kdbkit.runtime.primitives.ENTRY_POINT_GROUP`). Nothing is listed by hand: a module of
this package is a command when its source assigns ``SPEC`` at the top level.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from functools import lru_cache
from pathlib import Path

from kdbkit.runtime.driver.spec import DriverSpec
from kdbkit.runtime.problem import Problem

# MIOpenDriver's typed commands: activfp16, softmaxbfp16, ...
TYPE_SUFFIXES = {"fp16": "fp16", "bfp16": "bf16"}


def command_modules() -> tuple[str, ...]:
    """The modules that define a command: this package's, by name, then the added primitives'."""
    from kdbkit.runtime.primitives import primitive_modules

    package = __name__.rpartition(".")[0]
    folder = Path(__file__).parent
    own = tuple(f"{package}.{info.name}" for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda i: i.name)
                if not info.ispkg and _assigns_spec(folder / f"{info.name}.py"))
    added = []
    for module in primitive_modules():
        if not module.startswith("kdbkit.runtime.primitives.") and importlib.util.find_spec(module) is not None:
            if importlib.util.find_spec(f"{module}.driver") is not None:
                added.append(f"{module}.driver")
    return own + tuple(added)


def _assigns_spec(path: Path) -> bool:
    """Whether the module at ``path`` assigns ``SPEC`` at its top level (read, not imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets)
               for node in tree.body)


@lru_cache(maxsize=None)
def specs() -> tuple[DriverSpec, ...]:
    return tuple(importlib.import_module(name).SPEC for name in command_modules())


def aliases() -> dict[str, tuple[str, str | None]]:
    """Every other name a command answers to -> (the command, the --dtype it implies, or None)."""
    names: dict[str, tuple[str, str | None]] = {}
    for spec in specs():
        for name in (spec.command, *spec.aliases):
            if name != spec.command:
                names[name] = (spec.command, None)
            for suffix, dtype in TYPE_SUFFIXES.items():
                names[name + suffix] = (spec.command, dtype)
    return names


def for_primitive(primitive: str) -> DriverSpec | None:
    return next((s for s in specs() if s.primitive == primitive), None)


def command_line(problem: Problem, solver: int | str | None = None) -> str:
    """``[LogCmdSoftmax] kdb driver softmax --config '<config>' -F 1``: the driver command that
    runs exactly this problem (the config string carries type, shape, strides, mode, scalars),
    with ``-S`` when the call asked for a solver. The runtime's core finds this function through
    the entry point ``kdbkit.command_line`` (it does not import the driver)."""
    spec = for_primitive(problem.primitive)
    if spec is None:  # a primitive the driver does not know yet: still name the problem
        return f"[LogCmd] {problem.config()}"
    words = [f"[{spec.log_label}] kdb driver {spec.command} --config '{problem.config()}'", spec.command_flags(problem)]
    if solver is not None:
        words.append(f"-S {solver}")
    return " ".join(w for w in words if w)
