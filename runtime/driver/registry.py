"""The driver's primitives, and the command line that reproduces a problem (KDB_ENABLE_LOGGING_CMD).

``MODULES`` lists one module per ``kdb driver`` command, in help order; each defines ``SPEC``,
an instance of its :class:`~kdbkit.runtime.driver.spec.DriverSpec` subclass.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from kdbkit.runtime.driver.spec import DriverSpec
from kdbkit.runtime.problem import Problem

MODULES = ("activ", "softmax", "tensorop", "lnorm", "pool", "bnorm", "gemm", "conv")
# MIOpenDriver's typed commands: activfp16, softmaxbfp16, ...
TYPE_SUFFIXES = {"fp16": "fp16", "bfp16": "bf16"}


@lru_cache(maxsize=None)
def specs() -> tuple[DriverSpec, ...]:
    return tuple(importlib.import_module(f"kdbkit.runtime.driver.{name}").SPEC for name in MODULES)


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
    with ``-S`` when the call asked for a solver."""
    spec = for_primitive(problem.primitive)
    if spec is None:  # a primitive the driver does not know yet: still name the problem
        return f"[LogCmd] {problem.config()}"
    words = [f"[{spec.log_label}] kdb driver {spec.command} --config '{problem.config()}'", spec.command_flags(problem)]
    if solver is not None:
        words.append(f"-S {solver}")
    return " ".join(w for w in words if w)
