"""One primitive call: log its driver command, choose the solver, check the inputs, launch, check the outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kdbkit.runtime import env, numerics
from kdbkit.runtime.backends.base import Buffer
from kdbkit.runtime.errors import HandleClosedError
from kdbkit.runtime.immediate import Choice, choose
from kdbkit.runtime.logging_setup import log_command
from kdbkit.runtime.primitives import repeat
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.tensor import TensorDesc

if TYPE_CHECKING:
    from kdbkit.runtime.handle import Handle

Tensors = dict[str, tuple[Buffer, TensorDesc]]


def invoke(handle: "Handle", problem: Problem, solver: int | str | None, inputs: Tensors, outputs: Tensors,
           unused: Tensors | None = None) -> Choice:
    """Run ``problem`` with the chosen (or asked-for) solver on these device tensors.

    ``unused`` are tensors the invoker takes but this problem neither reads nor writes (a
    weight's gradient without a weight): passed on, never checked. With
    ``KDB_ENABLE_LOGGING_CMD``, the ``kdb driver`` command that runs the same problem is logged
    first (so a call that then fails is logged too).

    Raises:
        NoSolverError: as :func:`choose`. NumericsError: as KDB_CHECK_NUMERICS asks.
        HandleClosedError: the handle is closed.
    """
    if handle.closed:  # before the command is logged
        raise HandleClosedError()
    if env.get_bool("KDB_ENABLE_LOGGING_CMD"):
        from kdbkit.runtime.command_line import command_line  # the driver's formatter, not the driver

        log_command(command_line(problem, solver))
    choice, run = chosen_invoker(handle, problem, solver)
    checking = numerics.flags()
    if checking:
        numerics.check(handle.backend, problem.config(), "input", [(n, b, d) for n, (b, d) in inputs.items()])
    tensors = (*inputs.items(), *outputs.items(), *(unused or {}).items())
    buffers = {n: b for n, (b, _) in tensors}
    run(**buffers)
    repeat.note_invoke(run, buffers)
    if checking:
        numerics.check(handle.backend, problem.config(), "output", [(n, b, d) for n, (b, d) in outputs.items()])
    return choice


def chosen_invoker(handle: "Handle", problem: Problem, solver: int | str | None) -> tuple[Choice, object]:
    """The choice for ``problem`` (the chosen or asked-for solver) and its invoker.

    Raises:
        NoSolverError: as :func:`choose`. HandleClosedError: the handle is closed.
    """
    if handle.closed:  # its backend may be open (shared), but its chain and caches are not
        raise HandleClosedError()
    choice = choose(handle, problem, solver)  # the handle's dispatcher's
    return choice, handle.dispatcher.invoker(problem, choice.solver)
