"""The driver command that reproduces a primitive call, as ``KDB_ENABLE_LOGGING_CMD`` logs it.

The runtime's core does not import ``kdb driver`` (the driver sits above the core and imports
it): it asks whichever formatter is registered. kdbkit's driver registers
:func:`kdbkit.runtime.driver.registry.command_line` as the entry point ``driver`` of group
:data:`GROUP` (pyproject.toml); :func:`register_formatter` sets one in this process instead.
Without any, the line still names the problem by its config string.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

from kdbkit.runtime.problem import Problem

GROUP = "kdbkit.command_line"
Formatter = Callable[[Problem, "int | str | None"], str]
_registered: Formatter | None = None


def register_formatter(formatter: Formatter | None) -> None:
    """Format every later call's line with ``formatter`` (None: the entry point's again)."""
    global _registered
    _registered = formatter


def command_line(problem: Problem, solver: int | str | None = None) -> str:
    """The command that runs ``problem`` (with ``-S solver`` when the call asked for one)."""
    formatter = _registered or _from_entry_points()
    return formatter(problem, solver) if formatter else f"[LogCmd] {problem.config()}"


@lru_cache(maxsize=1)
def _from_entry_points() -> Formatter | None:
    from importlib.metadata import entry_points

    found = sorted(entry_points(group=GROUP), key=lambda ep: ep.name)
    return found[0].load() if found else None
