"""Tuning: find run on the GPU for a catalogue's problems, written as a system find-db to ship
beside the bundle (the role of AMD's tuning farm; ``kdb tune``).

Rankings depend on the exact device, so the file is named for the device's full target
(``sm_90_132.fdb``); ``kdb package --find-db`` puts it in that target's package. An existing
file at the output path keeps its other problems' rankings; the tuned ones replace theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.find_db import FindRecord, read_rankings, system_file_name, write_system_find_db
from kdbkit.kdb.version import __version__
from kdbkit.runtime.problem import Problem


@dataclass
class TuneResult:
    path: Path
    tuned: int = 0
    kept: int = 0  # rankings the file already held for other problems
    failures: list[tuple[str, str]] = field(default_factory=list)  # (config, why)


def find_db_name(handle) -> str:
    """``<target>.fdb`` for the handle's device (with its CU count: rankings are per device)."""
    return system_file_name(handle.target)


def tune(handle, problems: Sequence[Problem], out: Path, *, repeat: int = 3,
         progress: Callable[[int, int, int], None] | None = None) -> TuneResult:
    """Run find for every problem on ``handle``'s device and write the rankings to ``out/<target>.fdb``.

    A problem find cannot serve (no solver applies on this device) is reported, not fatal.

    Raises:
        BundleWriteError: the output folder cannot be written.
        NotABundleError: a file at the output path that is not a find-db.
    """
    from kdbkit.runtime.find import find_solutions

    out.mkdir(parents=True, exist_ok=True)
    path = out / find_db_name(handle)
    rankings = read_rankings(path) if path.exists() else {}
    result = TuneResult(path)
    tuned: set[str] = set()
    for done, problem in enumerate(problems, 1):
        config = problem.config()
        try:
            ranked = find_solutions(handle, problem, fresh=True, repeat=repeat)
        except KdbError as exc:
            result.failures.append((config, exc.problem))
        else:
            rankings[config] = [FindRecord(s.solver_id, s.solver, rank, s.time_ms, s.workspace)
                                for rank, s in enumerate(ranked)]
            tuned.add(config)
        if progress:
            progress(done, len(problems), len(result.failures))
    result.tuned, result.kept = len(tuned), len(set(rankings) - tuned)
    write_system_find_db(path, path.stem, rankings, producer=f"kdbkit {__version__} (kdb tune)")
    return result
