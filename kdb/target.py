"""Targets and bundle file names, parsed and produced in this one place.

A target is what a binary is built for: backend, arch, target features, and the
compute-unit count (``None`` for an arch-wide bundle). Its text form is the one used on
the command line and in file names::

    sm_90_132          CUDA, arch sm_90, 132 SMs
    gfx90a:xnack-_110  HIP, arch gfx90a with xnack off, 110 CUs
    gfx942             HIP, arch-wide
    ocl-3f9a1c2b7d10_2 OpenCL device id (hash of platform, device, driver), 2 CUs

The backend follows from the arch's spelling, and the arch's facts (wave size, matrix
instructions, ...) from its row: both in :mod:`kdbkit.kdb.arch` (``Target.arch_facts``).
File names carry arch and CU count only (``gfx90a_110.kdb``, ``gfx90a.kdb``,
``gfx90a_110.ukdb``), as MIOpen's do; target features live in the bundle's metadata and
are checked when a bundle is matched to a device.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

from kdbkit.kdb.arch import ARCH_PATTERN, BACKENDS, FEATURES_PATTERN, Arch, backend_of_arch, parse_arch
from kdbkit.kdb.errors import BundleNameError

__all__ = ["BACKENDS", "BUNDLE_SUFFIX", "USER_SUFFIX", "BundleName", "Target", "backend_of_arch", "bundle_file_name",
           "parse_bundle_file_name"]

_TARGET_RE = re.compile(rf"^(?P<arch>{ARCH_PATTERN})(?P<features>{FEATURES_PATTERN})(?:_(?P<cu>\d+))?$")
_FILE_RE = re.compile(rf"^(?P<arch>{ARCH_PATTERN})(?:_(?P<cu>\d+))?\.(?P<ext>kdb|ukdb)$")

BUNDLE_SUFFIX = ".kdb"
USER_SUFFIX = ".ukdb"


@functools.total_ordering
@dataclass(frozen=True)
class Target:
    """What a binary is built for.

    Attributes:
        backend: ``cuda``, ``hip`` or ``opencl``.
        arch: ``sm_90``, ``gfx90a``, ``ocl-<hex>``; never carries features.
        features: sorted target features such as ``("xnack-",)``; empty means "any".
        cu: compute-unit count, or ``None`` for an arch-wide target.
    """

    backend: str
    arch: str
    features: tuple[str, ...] = ()
    cu: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BundleNameError(f"unknown backend {self.backend!r}", f"use one of {', '.join(BACKENDS)}")
        if backend_of_arch(self.arch) != self.backend:
            raise BundleNameError(f"arch {self.arch!r} does not belong to backend {self.backend!r}",
                                  "name an arch of that backend")
        if self.cu is not None and self.cu <= 0:
            raise BundleNameError(f"compute-unit count must be positive, got {self.cu}", "give a positive count")
        object.__setattr__(self, "features", tuple(sorted(set(self.features))))

    @classmethod
    def parse(cls, text: str) -> "Target":
        """Parse ``<arch>[:<feature>...][_<cu>]``, e.g. ``gfx90a:xnack-_110``.

        Raises:
            BundleNameError: the text is not a target.
        """
        m = _TARGET_RE.match(text.strip())
        if not m:
            raise BundleNameError(f"malformed target {text!r}",
                                  "write it <arch>[:<feature>±]*[_<cu>], e.g. sm_90_132, gfx90a:xnack-_110 or gfx942")
        features = tuple(f for f in m["features"].split(":") if f)
        cu = int(m["cu"]) if m["cu"] else None
        return cls(backend_of_arch(m["arch"]), m["arch"], features, cu)

    @functools.cached_property  # solver gates ask it on every first call of a problem: parsed once
    def arch_facts(self) -> Arch:
        """The arch with its features, parsed, with its facts: ``arch_facts.has("wgmma")``."""
        return parse_arch(self.full_arch)

    @functools.cached_property  # every program lookup keys with it: an attribute read once made
    def full_arch(self) -> str:
        """Arch with its features, as compilers spell it: ``gfx90a:xnack-``."""
        return ":".join((self.arch, *self.features))

    def arch_wide(self) -> "Target":
        """The same target without a compute-unit count."""
        return replace(self, cu=None)

    def bundle_name(self, suffix: str = BUNDLE_SUFFIX) -> str:
        """File name of this target's bundle: ``<arch>_<cu>.kdb`` or ``<arch>.kdb``."""
        return bundle_file_name(self.arch, self.cu, suffix)

    def built_bundle_name(self) -> str:
        """The bundle ``kdb build`` writes for this target: what a message about a missing one names.

        The arch-wide ``<arch>.kdb``: the builder writes ``<arch>_<cu>.kdb`` only for programs
        compiled for one compute-unit count (a ``-DKDB_CU...`` option), and no program in kdbkit's
        catalogue is. The runtime looks for both names (``bundle_name`` first).
        """
        return self.arch_wide().bundle_name()

    def accepts(self, built_for: "Target") -> str | None:
        """Say why a binary built for ``built_for`` cannot run on this target.

        Returns:
            ``None`` when it can, else the reason. Backends and arches must be equal, a CU
            count (if the bundle has one) must be equal, and features the bundle was built
            with must be ones this target has (a bundle with no features fits any).
        """
        if built_for.backend != self.backend:
            return f"backend {built_for.backend} != {self.backend}"
        if built_for.arch != self.arch:
            return f"arch {built_for.arch} != {self.arch}"
        if built_for.cu is not None and built_for.cu != self.cu:
            return f"built for {built_for.cu} CUs, device has {self.cu}"
        extra = set(built_for.features) - set(self.features)
        if extra:
            return f"built with features {':'.join(sorted(extra))} that the device lacks"
        return None

    def __str__(self) -> str:
        return self.full_arch + (f"_{self.cu}" if self.cu is not None else "")

    def __lt__(self, other: object) -> bool:
        # By backend, arch, features, then CU count with the arch-wide target (no count) first:
        # a mixed list sorts, where comparing None with a count would raise.
        if not isinstance(other, Target):
            return NotImplemented
        return self._order() < other._order()

    def _order(self) -> tuple:
        return self.backend, self.arch, self.features, -1 if self.cu is None else self.cu


@dataclass(frozen=True)
class BundleName:
    """A parsed bundle file name."""

    arch: str
    cu: int | None
    user: bool  # True for a .ukdb user cache

    @property
    def backend(self) -> str:
        return backend_of_arch(self.arch)


def bundle_file_name(arch: str, cu: int | None, suffix: str = BUNDLE_SUFFIX) -> str:
    """Produce ``<arch>_<cu><suffix>`` or ``<arch><suffix>``; the one place names are made."""
    backend_of_arch(arch)
    if suffix not in (BUNDLE_SUFFIX, USER_SUFFIX):
        raise BundleNameError(f"bundle suffix must be {BUNDLE_SUFFIX} or {USER_SUFFIX}, got {suffix!r}",
                              "use one of those")
    return f"{arch}_{cu}{suffix}" if cu is not None else f"{arch}{suffix}"


def parse_bundle_file_name(name: str | Path) -> BundleName:
    """Parse ``gfx90a_110.kdb``, ``gfx90a.kdb`` or ``sm_90_132.ukdb`` (any folder is ignored).

    Raises:
        BundleNameError: the name follows none of these forms.
    """
    base = Path(name).name
    m = _FILE_RE.match(base)
    if not m:
        raise BundleNameError(f"{base!r} is not a bundle name",
                              "name it <arch>_<cu>.kdb, <arch>.kdb or <arch>.ukdb (e.g. gfx90a_110.kdb, sm_90.kdb)")
    return BundleName(m["arch"], int(m["cu"]) if m["cu"] else None, m["ext"] == "ukdb")
