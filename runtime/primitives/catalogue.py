"""Every program the primitives' solvers can ask for: what a bundle needs to serve every problem.

Each primitive's ``problem.catalogue()`` gives one problem per compile-time specialisation
(type, direction, mode where it changes the code); sizes, strides and scalars are launch
arguments, so these programs serve every shape. The offline builder compiles this list.
"""

from __future__ import annotations

import importlib

from kdbkit.runtime.primitives import load_all, primitive_modules
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import REGISTRY


def catalogue_problems() -> list:
    load_all()
    problems = []
    for module in primitive_modules():
        problems += importlib.import_module(f"{module}.problem").catalogue()
    return problems


def all_programs(backend: str | None = None, target=None) -> list[ProgramRequest]:
    """Every program any solver needs for any problem, each once, sorted.

    Args:
        backend: only the programs that build for this backend (vendor-only solvers, such as
            the CUDA tensor-core GEMM, name theirs); ``None``: all.
        target: only the programs of solvers that build for this target (``Solver.builds_for``).
    """
    requests = set()
    for problem in catalogue_problems():
        for solver in REGISTRY.for_primitive(problem.primitive):
            if ((backend is None or solver.backends is None or backend in solver.backends)
                    and (target is None or solver.builds_for(target))):
                requests.update(solver.programs(problem))
    return sorted(requests, key=str)
