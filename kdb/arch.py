"""Archs described once: how each backend spells its archs, a table of facts per arch, and the
typed :class:`Arch` a spelling parses into.

Three spellings, one per backend, in discovery order (GPUs of the native APIs before OpenCL)::

    sm_<NN>[a|f]   CUDA: sm_90, sm_90a (arch-specific), sm_120f (family-specific)
    gfx<id>        HIP (AMD): gfx90a, gfx942, gfx1100; target features ride along: gfx942:xnack-
    ocl-<hex>      OpenCL: a device id (hash of platform, device and driver); no facts beyond it

Every arch kdbkit knows is one row of :data:`ARCHS` (an :class:`ArchFacts`): wave size, the
most shared memory (LDS) one group may use, the matrix instructions it has, and the suffixes
NVRTC builds it with. Adding an arch is one row here, or :func:`register_arch` from outside.
An arch that is well spelled but has no row still parses: facts follow from a rule where one
exists (every CUDA warp is 32 lanes; ``mma.sync`` on fp16/bf16 is in every sm_80 and later,
as PTX keeps it), and are ``None`` or empty (unknown) where none does; ``Arch.known`` says
which. Solvers, checks and tools ask ``arch.has("wgmma")`` or ``arch.at_least("sm_80")``;
none parses an arch string itself.

This module imports nothing from ``runtime`` or ``packager``.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import NamedTuple

from kdbkit.kdb.errors import BundleNameError

EM_CUDA = 190  # the ELF e_machine of a cubin
EM_AMDGPU = 224  # and of an AMD GPU code object

# The matrix instructions an arch may declare (its row's ``matrix``), as solvers test them.
MATRIX_INSTRUCTIONS = {
    "mma.sync": "NVIDIA warp-level mma.sync on fp16 and bf16 (m16n8k16), sm_80 and later; "
                "Volta's and Turing's narrower forms are not declared (no kernel here uses them)",
    "wgmma": "NVIDIA Hopper's warpgroup MMA (built for the arch-specific sm_90a)",
    "tcgen05": "NVIDIA Blackwell's fifth-generation tensor-core instructions (sm_100a/f and kin)",
    "mfma": "AMD CDNA matrix fused multiply-add (v_mfma_*)",
    "wmma": "AMD RDNA3/RDNA4 wave matrix multiply-accumulate (v_wmma_*)",
}

_FEATURE = r"[a-z][a-z0-9]*[+-]"
_FEATURES = rf"(?::{_FEATURE})*"


# Spelling, ArchFacts and Arch are NamedTuples (typed, immutable) rather than frozen dataclasses:
# this module loads with every `import kdbkit.kdb`, and a dataclass costs several times more to define.
class Spelling(NamedTuple):
    """How one backend names its archs.

    Attributes:
        backend: ``cuda``, ``hip`` or ``opencl``.
        regex: an arch name (no features), matched whole, with the groups the parser reads.
        example: an arch as users write it, for messages.
        elf_machine: ``e_machine`` of its binaries; ``None`` where they are not ELF files.
    """

    backend: str
    regex: re.Pattern
    example: str
    elf_machine: int | None

    @property
    def full_regex(self) -> re.Pattern:
        """The arch with target features, as compilers take it: ``gfx90a:xnack-``."""
        return _full_regex(self.regex.pattern)


@functools.lru_cache(maxsize=None)
def _full_regex(pattern: str) -> re.Pattern:
    return re.compile(pattern + _FEATURES)


SPELLINGS: tuple[Spelling, ...] = (
    Spelling("cuda", re.compile(r"sm_(?P<sm>\d+)(?P<suffix>[af]?)"), "sm_90", EM_CUDA),
    Spelling("hip", re.compile(r"gfx(?P<gfx>[0-9a-f]+)"), "gfx942", EM_AMDGPU),
    Spelling("opencl", re.compile(r"ocl-[0-9a-f]{6,64}"), "ocl-3f9a1c2b7d10", None),
)
BACKENDS: tuple[str, ...] = tuple(s.backend for s in SPELLINGS)  # in discovery order
_BY_BACKEND = {s.backend: s for s in SPELLINGS}

# Any arch name, for the target and bundle-file grammars of kdb/target.py.
ARCH_PATTERN = "(?:" + "|".join(re.sub(r"\(\?P<\w+>", "(?:", s.regex.pattern) for s in SPELLINGS) + ")"
FEATURES_PATTERN = _FEATURES


def spelling_of(backend: str) -> Spelling:
    """The spelling of ``backend``'s archs.

    Raises:
        BundleNameError: no such backend.
    """
    try:
        return _BY_BACKEND[backend]
    except KeyError:
        raise BundleNameError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}") from None


class ArchFacts(NamedTuple):
    """One row of the table: what one arch is.

    Attributes:
        name: the arch without suffix or features: ``sm_90``, ``gfx942``.
        wave_size: lanes of a warp/wavefront as kernels here run (HIP's default: 64 on gfx9,
            32 on gfx10 and later); ``None``: unknown.
        lds_bytes: most shared memory (LDS) one group may use, opt-in included; ``None``: unknown.
        matrix: matrix instructions it has, names from :data:`MATRIX_INSTRUCTIONS`.
        suffixes: CUDA's ``a`` (arch-specific) and ``f`` (family-specific) spellings NVRTC builds.
        family: a family name for humans (``Hopper``, ``CDNA3``).
    """

    name: str
    wave_size: int | None
    lds_bytes: int | None
    matrix: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    family: str = ""


KIB = 1024
_MMA, _WGMMA, _TCGEN05 = frozenset({"mma.sync"}), frozenset({"mma.sync", "wgmma"}), frozenset({"mma.sync", "tcgen05"})
_AF = ("a", "f")


def _cuda(sm: int, lds_kib: int | None, matrix: frozenset[str], family: str,
          suffixes: tuple[str, ...] = ()) -> ArchFacts:
    return ArchFacts(f"sm_{sm}", 32, None if lds_kib is None else lds_kib * KIB, matrix, suffixes, family)


def _amd(ids: str, wave: int, lds_kib: int, matrix: frozenset[str], family: str) -> list[ArchFacts]:
    return [ArchFacts(f"gfx{i}", wave, lds_kib * KIB, matrix, (), family) for i in ids.split()]


# Shared memory per group from CUDA's compute-capability table (the opt-in maximum); AMD's from
# LLVM's AMDGPUUsage processor table (64 KiB a workgroup, 160 KiB on gfx950). gfx9 runs wave64;
# gfx10 and later can run both, and clang builds HIP wave32 there. ``None``: unknown here.
ARCHS: tuple[ArchFacts, ...] = (
    _cuda(70, 96, frozenset(), "Volta"),
    _cuda(72, 96, frozenset(), "Volta"),
    _cuda(75, 64, frozenset(), "Turing"),
    _cuda(80, 163, _MMA, "Ampere"),
    _cuda(86, 99, _MMA, "Ampere"),
    _cuda(87, 163, _MMA, "Ampere"),
    _cuda(88, None, _MMA, "sm_8x"),  # NVRTC 13 builds it; its shared-memory limit is not published here
    _cuda(89, 99, _MMA, "Ada"),
    _cuda(90, 227, _WGMMA, "Hopper", ("a",)),
    _cuda(100, 227, _TCGEN05, "Blackwell", _AF),
    _cuda(101, 227, _TCGEN05, "Blackwell", _AF),  # CUDA 13 calls it sm_110
    _cuda(103, 227, _TCGEN05, "Blackwell", _AF),
    _cuda(107, None, _MMA, "sm_10x", _AF),  # likewise
    _cuda(110, 227, _TCGEN05, "Blackwell", _AF),
    _cuda(120, 99, _MMA, "Blackwell", _AF),
    _cuda(121, 99, _MMA, "Blackwell", _AF),
    *_amd("900 902 904 906 909 90c", 64, 64, frozenset(), "GCN5"),
    *_amd("908", 64, 64, frozenset({"mfma"}), "CDNA1"),
    *_amd("90a", 64, 64, frozenset({"mfma"}), "CDNA2"),
    *_amd("940 941 942", 64, 64, frozenset({"mfma"}), "CDNA3"),
    *_amd("950", 64, 160, frozenset({"mfma"}), "CDNA4"),
    *_amd("1010 1011 1012 1013 1030 1031 1032 1033 1034 1035 1036", 32, 64, frozenset(), "RDNA"),
    *_amd("1100 1101 1102 1103 1150 1151 1152 1153", 32, 64, frozenset({"wmma"}), "RDNA3"),
    *_amd("1200 1201", 32, 64, frozenset({"wmma"}), "RDNA4"),
)

_table: dict[str, ArchFacts] = {row.name: row for row in ARCHS}
_table_lock = threading.Lock()


def register_arch(row: ArchFacts) -> ArchFacts:
    """Add an arch to the table (a new GPU, from a plug-in or a test), without editing this file.

    Archs parsed from now on carry its facts; a :class:`~kdbkit.kdb.target.Target` that has
    already read its ``arch_facts`` keeps what it read.

    Raises:
        BundleNameError: the name is not one a backend spells, the table has it already, or
            a matrix instruction is not one of :data:`MATRIX_INSTRUCTIONS`.
    """
    unknown = sorted(set(row.matrix) - MATRIX_INSTRUCTIONS.keys())
    if unknown:
        raise BundleNameError(f"arch {row.name}: unknown matrix instructions {unknown}",
                              f"name them from {', '.join(MATRIX_INSTRUCTIONS)}")
    row = row._replace(matrix=frozenset(row.matrix))
    parsed = parse_arch(row.name)
    if parsed.name != row.name:
        raise BundleNameError(f"arch row {row.name!r} carries a suffix or features",
                              f"register the arch itself ({parsed.name}) and list suffixes in its row")
    with _table_lock:
        if row.name in _table:
            raise BundleNameError(f"arch {row.name} is in the table already", "unregister it first")
        _table[row.name] = row
    parse_arch.cache_clear()
    return row


def unregister_arch(name: str) -> None:
    """Remove an arch :func:`register_arch` added (or any row); absent names are ignored."""
    with _table_lock:
        _table.pop(name, None)
    parse_arch.cache_clear()


def arch_row(name: str) -> ArchFacts | None:
    """The table's row for an arch name without suffix or features (``sm_90``), or ``None``."""
    with _table_lock:
        return _table.get(name)


def known_archs(backend: str | None = None) -> tuple[ArchFacts, ...]:
    """The table's rows (of one backend), in table order."""
    with _table_lock:
        rows = tuple(_table.values())
    return rows if backend is None else tuple(r for r in rows if spelling_of(backend).regex.fullmatch(r.name))


class Arch(NamedTuple):
    """An arch, parsed once, with its facts (immutable; made by :func:`parse_arch`).

    Attributes:
        backend: ``cuda``, ``hip`` or ``opencl``.
        name: the arch without suffix or features (``sm_90``, ``gfx942``), the table's key.
        suffix: CUDA's ``a`` or ``f``; empty otherwise.
        features: sorted target features (``("xnack-",)``).
        family: ``Hopper``, ``CDNA3``...; for an arch with no row, ``sm_13x`` or ``gfx12``.
        wave_size, lds_bytes, matrix: as in :class:`ArchFacts`; ``None``/empty when unknown.
        elf_machine: ``EM_CUDA``, ``EM_AMDGPU`` or ``None`` (OpenCL).
        known: a row describes this arch and spelling (else facts come from rules only).
    """

    backend: str
    name: str
    suffix: str = ""
    features: tuple[str, ...] = ()
    family: str = ""
    wave_size: int | None = None
    lds_bytes: int | None = None
    matrix: frozenset[str] = frozenset()
    elf_machine: int | None = None
    known: bool = False

    @property
    def spelling(self) -> str:
        """The arch as targets and bundle names spell it: ``sm_90a``, ``gfx942``."""
        return self.name + self.suffix

    @property
    def sm(self) -> int | None:
        """The SM number (``90`` for ``sm_90a``); ``None`` for an arch that is not CUDA's."""
        return int(self.name[3:]) if self.backend == "cuda" else None

    @property
    def gfx(self) -> str | None:
        """The gfx id (``"942"``, ``"90a"``); ``None`` for an arch that is not AMD's."""
        return self.name[3:] if self.backend == "hip" else None

    def has(self, instruction: str) -> bool:
        """Whether the arch has a matrix instruction named in :data:`MATRIX_INSTRUCTIONS`.

        Raises:
            ValueError: ``instruction`` is not one of them (a typo would otherwise say no, silently).
        """
        if instruction not in MATRIX_INSTRUCTIONS:
            raise ValueError(f"unknown matrix instruction {instruction!r}; known: {', '.join(MATRIX_INSTRUCTIONS)}")
        return instruction in self.matrix

    def at_least(self, other: str) -> bool:
        """Whether this is a CUDA arch at or after ``other`` (``"sm_80"``); False for another backend.

        Raises:
            ValueError: ``other`` is not a CUDA arch (AMD's and OpenCL's archs have no order).
        """
        reference = parse_arch(other)
        if reference.sm is None:
            raise ValueError(f"at_least compares CUDA archs; {other!r} is not one")
        return self.sm is not None and self.sm >= reference.sm

    def __str__(self) -> str:
        return ":".join((self.spelling, *self.features))


@functools.lru_cache(maxsize=256)
def parse_arch(text: str) -> Arch:
    """Parse an arch as any backend spells it, target features included: ``sm_90a``, ``gfx942:xnack-``.

    Returns:
        The arch with its row's facts, or with facts derived by rule (``known`` False) when the
        table has no row for it. Cached: a spelling is parsed once per process.

    Raises:
        BundleNameError: the text follows no backend's spelling.
    """
    name, *features = text.strip().split(":")
    for spelling in SPELLINGS:
        m = spelling.regex.fullmatch(name)
        if m is None:
            continue
        if not all(re.fullmatch(_FEATURE, f) for f in features):
            raise BundleNameError(f"arch {text!r}: target features are written <name>+ or <name>-",
                                  "e.g. gfx90a:xnack-")
        return _with_facts(spelling, m, tuple(sorted(set(features))))
    raise BundleNameError(f"unknown arch {text!r}",
                          "name one as " + ", ".join(f"{s.example} ({s.backend})" for s in SPELLINGS))


def _with_facts(spelling: Spelling, m: re.Match, features: tuple[str, ...]) -> Arch:
    groups = m.groupdict()
    suffix = groups.get("suffix") or ""
    name = m.group(0)[: len(m.group(0)) - len(suffix)]
    base = Arch(spelling.backend, name, suffix, features, elf_machine=spelling.elf_machine)
    with _table_lock:
        row = _table.get(name)
    if spelling.backend == "opencl":  # a device id: every fact is the device's to report
        return base._replace(family="OpenCL", known=True)
    if row is not None:
        return base._replace(family=row.family, wave_size=row.wave_size, lds_bytes=row.lds_bytes, matrix=row.matrix,
                       known=not suffix or suffix in row.suffixes)
    if spelling.backend == "cuda":  # rules: warps are 32 lanes; PTX keeps mma.sync from sm_80 on
        sm = int(groups["sm"])
        return base._replace(family=f"sm_{sm // 10}x", wave_size=32, matrix=_MMA if sm >= 80 else frozenset())
    gfx = groups["gfx"]
    return base._replace(family=f"gfx{gfx[:2] if len(gfx) >= 4 else gfx[:1]}")


def backend_of_arch(arch: str) -> str:
    """The backend an arch name (no features) belongs to.

    Raises:
        BundleNameError: the arch follows none of the known spellings.
    """
    for spelling in SPELLINGS:
        if spelling.regex.fullmatch(arch):
            return spelling.backend
    raise BundleNameError(f"unknown arch {arch!r}",
                          "name one as " + ", ".join(f"{s.example} ({s.backend})" for s in SPELLINGS))
