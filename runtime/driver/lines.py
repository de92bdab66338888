"""The driver's output lines, in MIOpenDriver's words where it has them.

::

    Problem: softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=4x8x16x16,...
    Solver: SoftmaxThread (3), chosen by heuristic
    GPU Kernel Time Forward Softmax Elapsed: 0.123456 ms (average)
    Forward Softmax Verifies OK on CPU reference (1.2e-07 < 1.0e-05)
    Forward Softmax FAILED: 3.4e-02 > 1.0e-05
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kdbkit.runtime.find import Solution
    from kdbkit.runtime.problem import Problem

# Choice.how (and the driver's own) -> the words after "chosen by".
HOW = {"heuristic": "heuristic", "find-db": "find-db (immediate mode)", "asked": "-S",
       "find": "find (-S -1)"}


def device(name: str, target: object) -> str:
    return f"Device: {name} ({target})"


def problem(p: "Problem") -> str:
    return f"Problem: {p.config()}"


def solver(name: str, solver_id: int, how: str) -> str:
    return f"Solver: {name} ({solver_id}), chosen by {HOW.get(how, how)}"


def find(solutions: list["Solution"]) -> str:
    ranking = ", ".join(f"{s.solver} ({s.solver_id}) {s.time_ms:.6f} ms" for s in solutions)
    sources = {s.source for s in solutions}
    if sources == {"timed"}:
        return f"Find: timed {len(solutions)} solver(s) and recorded the ranking in the user find-db: {ranking}"
    where = ", ".join(sorted("user" if s == "user" else f"system {s}" for s in sources))
    return f"Find: ranking read from the find-db ({where}), nothing timed: {ranking}"


def elapsed(title: str, ms: float) -> str:
    return f"GPU Kernel Time {title} Elapsed: {ms:.6f} ms (average)"


def verdict(title: str, error: float, tolerance: float, overwritten: list[str]) -> str:
    if overwritten:  # elements written where nothing should be, or exact results that differ
        return f"{title} FAILED: wrote {'; '.join(overwritten)}"
    if error <= tolerance:
        return f"{title} Verifies OK on CPU reference ({error:.1e} < {tolerance:.1e})"
    return f"{title} FAILED: {error:.1e} > {tolerance:.1e}"
