"""What a build is for: ``--target`` (an arch with its compute-unit count, ``sm_90_132``, or
arch-wide, ``gfx942``), ``--gpu`` (a product, ``MI300X``, through the table of known GPUs), and
which installed compiler builds each. No device is needed; ``kdb targets`` prints the table
and what the compilers here can build.

The table holds one device as the runtime sees it: an MI250X is two devices of 110 compute
units each, so its target is ``gfx90a_110``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from kdbkit.kdb.arch import arch_row
from kdbkit.kdb.target import Target, backend_of_arch
from kdbkit.runtime.backends.spec import BACKENDS
from kdbkit.runtime.compilers import Compiler, compiler_for, compilers_for
from kdbkit.packager.errors import TargetError
from kdbkit.runtime.errors import CompilerUnavailableError


@dataclass(frozen=True)
class KnownGpu:
    """A product: its ``--gpu`` name (and other spellings), arch and compute units (SMs on NVIDIA)."""

    name: str
    arch: str
    cu: int
    product: str
    aliases: tuple[str, ...] = ()

    @property
    def target(self) -> Target:
        return Target(backend_of_arch(self.arch), self.arch, cu=self.cu)


KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu("T4", "sm_75", 40, "NVIDIA Tesla T4"),
    KnownGpu("RTX-2080-Ti", "sm_75", 68, "NVIDIA GeForce RTX 2080 Ti"),
    KnownGpu("A100-SXM", "sm_80", 108, "NVIDIA A100 SXM4 (40 and 80 GB)", ("A100",)),
    KnownGpu("A100-PCIe", "sm_80", 108, "NVIDIA A100 PCIe"),
    KnownGpu("A30", "sm_80", 56, "NVIDIA A30"),
    KnownGpu("A10", "sm_86", 72, "NVIDIA A10"),
    KnownGpu("A40", "sm_86", 84, "NVIDIA A40"),
    KnownGpu("RTX-A6000", "sm_86", 84, "NVIDIA RTX A6000"),
    KnownGpu("RTX-3090", "sm_86", 82, "NVIDIA GeForce RTX 3090"),
    KnownGpu("L4", "sm_89", 58, "NVIDIA L4"),
    KnownGpu("L40S", "sm_89", 142, "NVIDIA L40S"),
    KnownGpu("RTX-4090", "sm_89", 128, "NVIDIA GeForce RTX 4090"),
    KnownGpu("H100-SXM", "sm_90", 132, "NVIDIA H100 SXM5 80 GB", ("H100",)),
    KnownGpu("H100-PCIe", "sm_90", 114, "NVIDIA H100 PCIe"),
    KnownGpu("H100-NVL", "sm_90", 132, "NVIDIA H100 NVL"),
    KnownGpu("H200", "sm_90", 132, "NVIDIA H200 141 GB"),
    KnownGpu("GH200", "sm_90", 132, "NVIDIA GH200 Grace Hopper"),
    KnownGpu("B200", "sm_100", 148, "NVIDIA B200"),
    KnownGpu("RTX-5090", "sm_120", 170, "NVIDIA GeForce RTX 5090"),
    KnownGpu("MI100", "gfx908", 120, "AMD Instinct MI100"),
    KnownGpu("MI210", "gfx90a", 104, "AMD Instinct MI210"),
    KnownGpu("MI250", "gfx90a", 104, "AMD Instinct MI250 (each of its two devices)"),
    KnownGpu("MI250X", "gfx90a", 110, "AMD Instinct MI250X (each of its two devices)"),
    KnownGpu("MI300A", "gfx942", 228, "AMD Instinct MI300A"),
    KnownGpu("MI300X", "gfx942", 304, "AMD Instinct MI300X"),
    KnownGpu("MI325X", "gfx942", 304, "AMD Instinct MI325X"),
    KnownGpu("RX-7900-XTX", "gfx1100", 96, "AMD Radeon RX 7900 XTX"),
    KnownGpu("W7900", "gfx1100", 96, "AMD Radeon PRO W7900"),
    KnownGpu("RX-9070-XT", "gfx1201", 64, "AMD Radeon RX 9070 XT"),
)


def _spelling(name: str) -> str:
    """A GPU name without case, spaces, hyphens or underscores: ``h100 sxm`` = ``H100-SXM``."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def find_gpu(name: str) -> KnownGpu:
    """The known GPU ``name`` spells (any case; spaces, hyphens and underscores ignored).

    Raises:
        TargetError: no such GPU; the message names the closest and lists the table.
    """
    wanted = _spelling(name)
    for gpu in KNOWN_GPUS:
        if wanted in {_spelling(n) for n in (gpu.name, *gpu.aliases)}:
            return gpu
    names = [g.name for g in KNOWN_GPUS]
    close = difflib.get_close_matches(name.upper(), names, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise TargetError(f"unknown GPU {name!r}",
                      f"{hint}known: {', '.join(names)} (kdb targets lists them); or name the target: "
                      "--target <arch>_<compute units>")


def builder_of(target: Target) -> Compiler:
    """The installed compiler that builds ``target``.

    Raises:
        TargetError: no compiler here knows the arch; the message lists what they build.
        CompilerUnavailableError: the backend's compilers are not installed here.
    """
    compiler = compiler_for(target)
    known = compiler.supported_archs()
    arch = target.arch_facts  # sm_90a builds where sm_90 does: compilers list the archs without suffix
    if known is not None and arch.name not in known:
        raise TargetError(f"{compiler.name} ({compiler.identity()}) does not build {target.arch}",
                          f"it builds {', '.join(known)}")
    if arch.suffix and not arch.known:
        raise TargetError(f"{target.arch} is no arch {compiler.name} builds: "
                          f"{arch.name} has no {arch.suffix!r} variant",
                          f"build {arch.name}" + "".join(f" or {arch.name}{s}" for s in _suffixes(arch.name)))
    return compiler


def _suffixes(name: str) -> tuple[str, ...]:
    row = arch_row(name)
    return row.suffixes if row is not None else ()


def resolve_targets(targets: Sequence[str] = (), gpus: Sequence[str] = ()) -> list[Target]:
    """The targets ``--target`` and ``--gpu`` name, in order, each once, each checked buildable here.

    Raises:
        BundleNameError: a malformed ``--target``.
        TargetError: an unknown GPU or arch (the message lists the choices).
        CompilerUnavailableError: no compiler installed for a target's backend.
    """
    if not targets and not gpus:
        raise TargetError("no target to build for", "give --target <arch>[_<cu>] or --gpu <name> (kdb targets lists them)")
    found: list[Target] = []
    for target in (*(Target.parse(t) for t in targets), *(find_gpu(g).target for g in gpus)):
        builder_of(target)
        if target not in found:
            found.append(target)
    return found


@dataclass(frozen=True)
class CompilerReport:
    """One compiler as ``kdb targets`` shows it: identity and arches, or why it is missing."""

    name: str
    backend: str
    identity: str | None
    archs: tuple[str, ...] | None
    missing: str | None


def compiler_reports(backends: Iterable[str] | None = None) -> list[CompilerReport]:
    """Every offline compiler of ``backends`` (by default every backend whose binaries load
    elsewhere than where they were built: not OpenCL, which builds for local devices), installed or not."""
    if backends is None:
        backends = [spec.name for spec in BACKENDS if not spec.machine_local]
    reports = []
    for backend in backends:
        for compiler in compilers_for(backend):
            try:
                identity, missing = compiler.identity(), None
            except CompilerUnavailableError as exc:
                identity, missing = None, exc.problem
            reports.append(CompilerReport(compiler.name, backend, identity, compiler.supported_archs()
                                          if identity else None, missing))
    return reports


def buildable_here(gpu: KnownGpu) -> str:
    """``nvrtc 13.0 + ...`` (the compiler that would build ``gpu``'s target), or why none would."""
    try:
        compiler = builder_of(gpu.target)
        return compiler.identity()
    except (TargetError, CompilerUnavailableError) as exc:
        return f"no: {exc.problem}"
