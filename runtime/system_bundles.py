"""Find the installed system bundles that fit a device, with a trace of every candidate.

For a device of target ``T`` the candidates are, in order: ``<arch>_<cu>.kdb`` in each
search folder, then the arch-wide ``<arch>.kdb`` in each. A file is accepted only if it
opens, its metadata names a target that ``T`` accepts (same backend and arch, same CU
count if it has one, no features the device lacks) and its binaries are of the format the
backend loads. Every other candidate is rejected with its reason, so a wrong binary is
never loaded and a user can see why a bundle was not used (``kdb devices``, ``kdb doctor``).
This is a pure function of the folders and the target; it opens files read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kdb import Bundle, KdbError
from kdb.target import Target
from runtime.paths import SearchDir


@dataclass(frozen=True)
class Candidate:
    """One file considered for a device: accepted, rejected (with why), or missing."""

    path: Path
    origin: str
    status: str  # "accepted" | "rejected" | "missing"
    reason: str = ""


def find_system_bundles(target: Target, binary_format: str, dirs: list[SearchDir]) -> tuple[list[Bundle], list[Candidate]]:
    """Open the bundles that fit ``target``, best first.

    Args:
        target: the device's target (with its CU count and features).
        binary_format: what the backend loads (``cubin``, ``hsaco``, ``ocl-binary``).
        dirs: folders to search, in order (see :func:`runtime.paths.system_db_dirs`).

    Returns:
        The accepted bundles (open, read-only; the caller closes them) and the trace.
    """
    names = [target.bundle_name()]
    if target.cu is not None:
        names.append(target.arch_wide().bundle_name())
    accepted: list[Bundle] = []
    trace: list[Candidate] = []
    for name in names:
        for d in dirs:
            path = d.path / name
            if not path.is_file():
                trace.append(Candidate(path, d.origin, "missing"))
                continue
            try:
                bundle = Bundle.open(path)
            except KdbError as exc:
                trace.append(Candidate(path, d.origin, "rejected", str(exc)))
                continue
            reason = _why_not(bundle, target, binary_format)
            if reason:
                bundle.close()
                trace.append(Candidate(path, d.origin, "rejected", reason))
            else:
                accepted.append(bundle)
                trace.append(Candidate(path, d.origin, "accepted"))
    return accepted, trace


def _why_not(bundle: Bundle, target: Target, binary_format: str) -> str | None:
    md = bundle.metadata
    if md.target is None:
        return "the bundle names no target"
    mismatch = target.accepts(md.target)
    if mismatch:
        return f"built for {md.target}: {mismatch}"
    if md.binary_format != binary_format:
        return f"holds {md.binary_format or 'unknown'} binaries; this backend loads {binary_format}"
    if not md.compiler:
        return "names no compiler, so its keys cannot be matched (a MIOpen file? convert it with `kdb db merge`)"
    return None
