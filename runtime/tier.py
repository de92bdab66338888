"""What a tier of the lookup chain is: :class:`Source`, :class:`WritableSource`, and what the chain gives them.

A tier answers ``get(request, steps)`` with a binary or None; a writable one also takes
``put(request, binary, key)``, which the JIT calls with what it compiled. A tier is handed a
:class:`TierContext` when a handle assembles its chain (``attach``): the target, the binary
format and the one key function, so that a tier outside kdbkit keys its entries exactly as the
user cache and the JIT do and needs nothing private. It describes itself (``describe``, for
``kdb resolve`` and ``kdb doctor``) and may offer a compile lease (``lease``) for the JIT to hold.

A binary from a tier runs on the device, so a tier must prove its entries are what was asked
for: a bundle checks each entry's row and hash; a tier that stores bytes under a string should
subclass :class:`kdbkit.runtime.keyed_tier.KeyedTier`, which seals each entry with its key and
its hash and refuses what does not match. A tier never crashes a lookup: whatever a tier
that does not compile raises is, through :func:`read` and :func:`write`, one warning and a miss.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Sequence

from kdbkit.kdb import Target
from kdbkit.runtime import tier_stats
from kdbkit.runtime.errors import KernelSourceError, OptionsError
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.program import Step, Steps
from kdbkit.runtime.program_key import ProgramKey, ProgramRequest

if TYPE_CHECKING:
    from kdbkit.runtime.preflight import DeviceRuntime
    from kdbkit.runtime.compilers import LazyCompiler
    from kdbkit.runtime.lease import CompileLease
    from kdbkit.runtime.lookup import Keys

_log = get_logger("runtime.lookup")


# TierContext, SourceInfo and SourceCheck are NamedTuples (typed, immutable) rather than frozen
# dataclasses: this module loads on the way to every process's first handle, and a dataclass
# costs several times more to define.
class TierContext(NamedTuple):
    """What the chain tells each tier about the handle it serves.

    Attributes:
        target: the device's target.
        binary_format: what the backend loads (``cubin``, ``hsaco``, ``ocl-binary``).
        keys: the handle's keys (``keys.key(request, compiler)``), for a tier whose entries were
            made by a compiler it names, as a bundle's are.
        compiler: the local compiler (``compiler.identity()``), found on first use.
    """

    target: Target
    binary_format: str
    keys: "Keys"
    compiler: "LazyCompiler"
    runtime: "DeviceRuntime | None" = None  # the driver's (system bundles it cannot load are passed over)

    def key(self, request: ProgramRequest) -> ProgramKey | None:
        """``request``'s key for the local compiler, as the user cache and the JIT key it
        (:func:`~kdbkit.runtime.program_key.program_key`); None when there is no local compiler."""
        identity = self.compiler.identity()
        return None if identity is None else self.keys.key(request, identity)


class SourceInfo(NamedTuple):
    """How a tier describes itself to ``kdb resolve`` and ``kdb doctor``."""

    name: str  # what Program.source says when it answers
    where: str  # where it looks: files, a folder, a server
    writable: bool  # whether the JIT writes what it compiles into it


class SourceCheck(NamedTuple):
    """One health fact about a tier, for ``kdb doctor`` (``ok`` False: a problem to fix)."""

    item: str
    value: str
    ok: bool = True


class Source(ABC):
    """One tier of the lookup chain below memory.

    Subclasses set ``name`` and implement ``get``. The rest is optional: ``attach`` (keep the
    context), ``discard``, ``searched``, ``describe``, ``checks``, ``lease``, ``close``.
    """

    name: ClassVar[str]  # what Program.source says when this tier answers
    title: ClassVar[str] = ""  # its heading in `kdb doctor` (default: name)
    writable: bool = False  # True only on a WritableSource (an instance may turn it off)
    immutable: ClassVar[bool] = False  # True: what it holds never changes, so the JIT need not re-check it
    compiles: ClassVar[bool] = False  # True: its errors are the request's (the JIT); it must come last

    def attach(self, context: TierContext) -> None:
        """Called once when a handle puts this tier into its chain, before any ``get``."""

    @abstractmethod
    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        """The binary for ``request``, or None; each step taken is timed into ``steps``.

        Never raises for a damaged entry or file (it warns once and answers None). Only a tier
        that compiles may raise, when the request cannot be served (compiling is forbidden or
        impossible); anything another tier raises is taken as a miss with one warning.
        """

    def discard(self, request: ProgramRequest) -> None:
        """The binary this source gave for ``request`` does not load: forget it (default: nothing)."""

    def searched(self) -> str:
        """Where this source looked, for a "not found" message; empty when it says nothing."""
        return ""

    def describe(self) -> SourceInfo:
        """Its name, where it looks and whether it is written to."""
        return SourceInfo(self.name, self.searched(), self.writable)

    def checks(self) -> list[SourceCheck]:
        """Health facts for ``kdb doctor`` (default: none)."""
        return []

    def lease(self) -> "CompileLease | None":
        """A compile lease the JIT holds, with the others', around a compile (default: none)."""
        return None

    def close(self) -> None:
        """Release files and connections this source holds open."""


class WritableSource(Source):
    """A tier the JIT writes through to: what it compiles is ``put`` into every writable tier."""

    writable = True

    @abstractmethod
    def put(self, request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
        """Store ``binary``, compiled for ``request``, under ``key``.

        ``key`` is the one the JIT computed from the very text it compiled; a tier stores under
        it (not under a key it computes again, which an edit of the source could change meanwhile).
        Never raises for a store that cannot be written (warn once); anything raised is taken
        as one warning.
        """


# What a lookup raises about the request itself (no such kernel file, malformed options): the
# request's error, whichever tier met it first, never taken for that tier's failure.
REQUEST_ERRORS = (KernelSourceError, OptionsError)


def read(source: Source, request: ProgramRequest, steps: Steps) -> bytes | None:
    """``source.get`` where a fault of a tier that does not compile is a miss with one warning."""
    t0 = time.perf_counter()
    try:
        return source.get(request, steps)
    except REQUEST_ERRORS:
        raise
    except Exception as exc:
        if source.compiles:  # its errors say why the request cannot be served
            raise
        return failed(source, exc, steps, (time.perf_counter() - t0) * 1e3)


def failed(source: Source, exc: Exception, steps: Steps, ms: float) -> None:
    """Note that ``source`` raised ``exc`` (a step, one warning per tier): its answer is a miss."""
    steps.append(Step(source.name, ms, "failed"))
    warn_once(f"tier-failed:{source.name}", f"cache tier {source.name} failed ({type(exc).__name__}: {exc}); "
              "taking its answers as misses while it fails", logger=_log)
    return None


def discard(source: Source, request: ProgramRequest) -> None:
    """``source.discard`` where a fault is one warning: forgetting a bad entry only saves work."""
    try:
        source.discard(request)
    except Exception as exc:
        warn_once(f"tier-discard-failed:{source.name}", f"cache tier {source.name} cannot forget {request} "
                  f"({type(exc).__name__}: {exc}); it may offer it again", logger=_log)


def lease_of(source: Source) -> "CompileLease | None":
    """``source.lease()`` where a fault is one warning and no lease: a lease only saves work."""
    try:
        return source.lease()
    except Exception as exc:
        warn_once(f"tier-lease-failed:{source.name}", f"cache tier {source.name} offers no compile lease "
                  f"({type(exc).__name__}: {exc}); compiling without it", logger=_log)
        return None


def searched(source: Source) -> str:
    """``source.searched()`` for a message, never raising (a tier that fails says so instead)."""
    try:
        return source.searched()
    except Exception as exc:
        return f"the tier {source.name} ({type(exc).__name__}: {exc})"


def write_all(tiers: Sequence[Source], request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
    """:func:`write` ``binary`` into each writable tier of ``tiers`` (a compile's tiers, or the
    tiers above the one a hit came from)."""
    for tier in tiers:
        if tier.writable:
            write(tier, request, binary, key)


def write(source: Source, request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
    """``source.put`` where a fault is one warning: a tier that cannot store costs only speed."""
    try:
        source.put(request, binary, key)
        tier_stats.PROCESS.note(source.name, "puts")
    except Exception as exc:
        tier_stats.PROCESS.note(source.name, "errors")
        warn_once(f"tier-put-failed:{source.name}", f"cache tier {source.name} cannot store {request} "
                  f"({type(exc).__name__}: {exc}); what is compiled stays out of it", logger=_log)
