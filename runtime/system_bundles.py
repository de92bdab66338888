"""Find the installed system bundles that fit a device, with a trace of every candidate.

For a device of target ``T`` the candidates are, in order: ``<arch>_<cu>.kdb`` in each
search folder, then the arch-wide ``<arch>.kdb`` in each; a bundle file named directly in
``KDB_SYSTEM_DB_PATH`` is considered in the pass its name belongs to (the first pass when its
name is neither, ``my-kernels.kdb`` say). A file is accepted only if it
opens, its metadata names a target that ``T`` accepts (same backend and arch, same CU
count if it has one, no features the device lacks), its binaries are of the format the
backend loads and the device's driver loads them (runtime/preflight.py: the compiler's version,
an AMD code object's version); with ``KDB_TRUSTED_KEYS`` set, it must also come from a kernel package one of
those keys signed (runtime/package_trust.py). Every other candidate is rejected with its reason, so a wrong binary is
never loaded and a user can see why a bundle was not used (``kdb devices``, ``kdb doctor``).

The search is lazy: the runtime asks for the i-th accepted bundle only when the ones before
it lack a program, so a process whose first bundle has everything opens one file and never
scans the installed packages. Files are opened read-only and immutable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from kdbkit.kdb import Bundle, BundleNotFoundError, KdbError
from kdbkit.kdb.target import Target
from kdbkit.runtime import package_trust
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.paths import SearchDir
from kdbkit.runtime.preflight import DeviceRuntime, bundle_refusal

_log = get_logger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One file considered for a device: accepted, rejected (with why), or missing."""

    path: Path
    origin: str
    status: str  # "accepted" | "rejected" | "missing"
    reason: str = ""


class SystemBundleSearch:
    """The accepted system bundles for one target, found one at a time as they are needed.

    Args:
        target: the device's target (with its CU count and features).
        binary_format: what the backend loads (``cubin``, ``hsaco``, ``ocl-binary``).
        dirs: folders to search, in order; consumed lazily (see
            :func:`runtime.paths.iter_system_db_dirs`).
    """

    def __init__(self, target: Target, binary_format: str, dirs: Iterable[SearchDir],
                 runtime: DeviceRuntime | None = None):
        self.target = target
        self.binary_format = binary_format
        self.runtime = runtime  # the driver's: a bundle it cannot load is rejected, with why
        self.trace: list[Candidate] = []
        self._dirs_iter = iter(dirs)
        self._dirs: list[SearchDir] = []
        self._accepted: list[Bundle] = []
        self._pending = self._search()
        self._exhausted = False
        self._lock = threading.Lock()

    def _all_dirs(self) -> Iterator[SearchDir]:
        yield from self._dirs
        for d in self._dirs_iter:
            self._dirs.append(d)
            yield d

    def _search(self) -> Iterator[Bundle]:
        names = [self.target.bundle_name()]
        if self.target.cu is not None:
            names.append(self.target.arch_wide().bundle_name())
        for i, name in enumerate(names):
            for d in self._all_dirs():
                if d.is_file:
                    if d.path.name != name and (i > 0 or d.path.name in names):
                        continue  # considered in the pass its name belongs to
                    bundle = self._consider(d, d.path)
                else:
                    bundle = self._consider(d, d.path / name)
                if bundle is not None:
                    yield bundle

    def _consider(self, d: SearchDir, path: Path) -> Bundle | None:
        try:
            bundle = Bundle.open(path, immutable=True)
        except BundleNotFoundError:
            return self._note(Candidate(path, d.origin, "missing"))
        except KdbError as exc:
            return self._note(Candidate(path, d.origin, "rejected", exc.problem))
        reason = _why_not(bundle, self.target, self.binary_format, self.runtime) or package_trust.why_untrusted(
            path, d.origin)
        if reason:
            bundle.close()
            return self._note(Candidate(path, d.origin, "rejected", reason))
        self._note(Candidate(path, d.origin, "accepted"))
        _log.info("system bundle %s opened for %s", path, self.target)
        return bundle

    def _note(self, candidate: Candidate) -> None:
        self.trace.append(candidate)
        _log.info2("system bundle %s (%s): %s%s", candidate.path, candidate.origin, candidate.status,
                   f": {candidate.reason}" if candidate.reason else "")

    def get(self, i: int) -> Bundle | None:
        """The i-th accepted bundle (best first), or None when there are no more."""
        try:
            return self._accepted[i]  # found already (every lookup asks): no lock, a list read is atomic
        except IndexError:
            pass
        with self._lock:
            while len(self._accepted) <= i and not self._exhausted:
                nxt = next(self._pending, None)
                if nxt is None:
                    self._exhausted = True
                else:
                    self._accepted.append(nxt)
            return self._accepted[i] if i < len(self._accepted) else None

    def __iter__(self) -> Iterator[Bundle]:
        i = 0
        while (bundle := self.get(i)) is not None:
            yield bundle
            i += 1

    def complete(self) -> list[Bundle]:
        """Finish the search; every accepted bundle, and ``trace`` now lists every candidate."""
        return list(self)

    @property
    def found_none(self) -> bool:
        """True once the search is over and accepted nothing."""
        return self._exhausted and not self._accepted

    def close(self) -> None:
        with self._lock:
            for b in self._accepted:
                b.close()
            self._accepted.clear()
            self._exhausted = True


def find_system_bundles(target: Target, binary_format: str, dirs: Iterable[SearchDir],
                        runtime: DeviceRuntime | None = None) -> tuple[list[Bundle], list[Candidate]]:
    """Open every bundle that fits ``target`` (and loads under ``runtime``), best first, and the
    trace of all candidates.

    Returns:
        The accepted bundles (open, read-only; the caller closes them) and the trace.
    """
    search = SystemBundleSearch(target, binary_format, dirs, runtime)
    return search.complete(), search.trace


def bundle_for_device(target: Target, binary_format: str, dirs: Iterable[SearchDir],
                      runtime: DeviceRuntime | None = None) -> tuple[Candidate | None, list[Candidate]]:
    """Which system bundle a device would use first, and the whole trace (files closed again).

    For reports (``kdb devices``, ``kdb doctor``), not for resolution: it opens every candidate.
    """
    bundles, trace = find_system_bundles(target, binary_format, dirs, runtime)
    for b in bundles:
        b.close()
    return next((c for c in trace if c.status == "accepted"), None), trace


def _why_not(bundle: Bundle, target: Target, binary_format: str, runtime: DeviceRuntime | None = None) -> str | None:
    md = bundle.metadata
    if md.target is None:
        return "the bundle names no target"
    mismatch = target.accepts(md.target)
    if mismatch:
        return f"built for {md.target}: {mismatch}"
    if md.binary_format != binary_format:
        return f"holds {md.binary_format or 'unknown'} binaries; this backend loads {binary_format}"
    if not md.compiler:
        return "names no compiler, so its keys cannot be matched (a file written by MIOpen?)"
    return bundle_refusal(bundle, runtime) or None
