"""A resolved program, and the steps of its resolution with their times.

A :class:`Program` is what the lookup chain returns: the loaded module, which source it came
from, and every step taken to find it (which tier was asked, how long it took, what it
answered). ``kdb resolve`` prints the steps; the startup benchmark reads them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kdbkit.runtime.backends.base import Kernel, Module
from kdbkit.runtime.program_key import ProgramRequest

SOURCES = ("memory", "system", "user", "jit")  # the tiers of the default chain, in order


@dataclass
class Step:
    """One step of a resolution: what was tried, how long it took, what happened."""

    name: str
    ms: float
    outcome: str


class Steps(list):
    """The steps of one resolution, in order; :meth:`time` records one."""

    def time(self, name: str, outcome: str = "miss") -> "_Timer":
        """``with steps.time("user") as t: ...; t.outcome = "hit"`` records the step when the block ends."""
        return _Timer(self, name, outcome)

    @property
    def total_ms(self) -> float:
        return sum(s.ms for s in self)


class _Timer:
    def __init__(self, steps: Steps, name: str, outcome: str):
        self.steps, self.name, self.outcome = steps, name, outcome

    def __enter__(self) -> "_Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.steps.append(Step(self.name, (time.perf_counter() - self.t0) * 1e3, self.outcome))


@dataclass
class Program:
    """A loaded program and how it was found.

    Attributes:
        request: the kernel file and normalised options asked for.
        module: the loaded binary.
        source: the tier that answered (``memory``, ``system``, ``user``, ``jit`` in the
            default chain).
        steps: every step of the resolution, timed.
    """

    request: ProgramRequest
    module: Module
    source: str
    steps: Steps = field(default_factory=Steps)
    _functions: dict[str, Kernel] = field(default_factory=dict, repr=False)

    @property
    def kernel_file(self) -> str:
        return self.request.kernel_file

    @property
    def options(self) -> tuple[str, ...]:
        return self.request.options

    @property
    def total_ms(self) -> float:
        return self.steps.total_ms

    def function(self, name: str) -> Kernel:
        """The kernel ``name`` in this program (looked up once, then cached)."""
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self.module.function(name)
        return fn

    def seen_again(self, steps: Steps) -> "Program":
        """This program as a later resolution finds it in memory: same module and kernels."""
        return Program(self.request, self.module, "memory", steps, self._functions)
