"""Which kernel package or bundle fits a GPU: every candidate in a folder, ranked or rejected with why.

For a device of target ``T`` a candidate is, best first:

0. built for ``T`` exactly (``kdbkit-kernels-sm_90-132``, ``sm_90_132.kdb``);
1. arch-wide (``kdbkit-kernels-sm_90``, ``sm_90.kdb``);
2. a package tuned for another CU count whose bundle is arch-wide: its programs fit, its
   find-db does not (the runtime only reads a find-db named for the device).

Within a rank, a wheel comes before a bare bundle (it carries a find-db and a manifest), then
the newer version. Never another backend or arch, never a CU-specific bundle for another
count, never one built with target features the device lacks, never a package for other
kdbkit versions, and never one built from kernel sources other than the ones installed here
(its programs would miss and compile anyway): each of those is rejected, with the reason.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from kdbkit.kdb import Target, open_bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.version import __version__
from kdbkit.packager.code_object_checks import CODE_OBJECT_VERSION
from kdbkit.packager.wheel import MANIFEST, PACKAGE_PREFIX, Manifest, package_name
from kdbkit.packager.wheel_checks import MAX_TEXT_BYTES
from kdbkit.runtime.kernel_sources import KernelSearchPath, KernelSourceError
from kdbkit.runtime.preflight import DeviceRuntime, bundle_code_object_version, refusal


@dataclass(frozen=True)
class Candidate:
    """A wheel or a bare bundle found in the folder, with what it says about itself."""

    path: Path
    kind: str  # "wheel" | "bundle"
    target: Target | None = None  # what it is for (a wheel's package target)
    version: str = ""
    bundle_target: Target | None = None  # the target of the bundle inside
    sources: dict[str, str] = field(default_factory=dict, hash=False)
    kdbkit: str = ""  # a wheel's supported kdbkit versions
    damaged: str = ""  # why it cannot be read at all
    compiler: str = ""  # what made its binaries (the driver must load what that compiler makes)
    code_objects: int | None = None  # the AMD code object version of its binaries, where known
    package: str = ""  # a wheel's package name, as its manifest says
    part: int = 1  # a wheel split by size is part `part` of `parts` (kdb package --max-wheel-size)
    parts: int = 1
    others: tuple[Path, ...] = ()  # the first part's: the wheels of parts 2..parts, found beside it
    manifest_sha256: str = ""  # a wheel's
    part_manifests: dict[str, str] = field(default_factory=dict, hash=False)  # a first part's Manifest.others

    @property
    def wheels(self) -> list[Path]:
        """Every wheel installing this candidate takes: itself and its other parts."""
        return [self.path, *self.others]


@dataclass
class Choice:
    """For one device: the candidate to install (or none), and each other one with why not."""

    device: Target
    chosen: Candidate | None
    rank: int | None
    rejected: list[tuple[Candidate, str]]


def scan(folder: Path) -> list[Candidate]:
    """Every kernel wheel (``kdbkit_kernels_*.whl``) and bundle (``*.kdb``) under ``folder``,
    sorted by path; a local package index's per-project folders are walked too. A package split
    into several wheels is one candidate, its first part's, carrying the others."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".whl" and path.name.startswith(PACKAGE_PREFIX.replace("-", "_")):
            found.append(wheel_candidate(path))
        elif path.suffix == ".kdb" and path.is_file():
            found.append(_bundle(path))
    return _with_parts(found)


def wheel_candidate(path: Path) -> Candidate:
    """What a kernel wheel says about itself (from its manifest alone; nothing else is read), or
    why it cannot be read (``damaged``)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/" + MANIFEST) and n.count("/") == 1]
            if len(names) != 1:
                return Candidate(path, "wheel", damaged=f"holds {len(names)} {MANIFEST} files, not one")
            info = archive.getinfo(names[0])
            if info.file_size > MAX_TEXT_BYTES:  # never read a bomb to learn what a wheel is
                return Candidate(path, "wheel", damaged=f"its {MANIFEST} declares {info.file_size} bytes")
            with archive.open(info) as member:
                text = member.read(MAX_TEXT_BYTES + 1)
            if len(text) > MAX_TEXT_BYTES:
                return Candidate(path, "wheel", damaged=f"its {MANIFEST} is over {MAX_TEXT_BYTES} bytes")
            manifest = Manifest.from_json(text.decode("utf-8", "replace"), str(path))
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        return Candidate(path, "wheel", damaged=f"not a readable wheel ({exc})")
    except KdbError as exc:
        return Candidate(path, "wheel", damaged=exc.problem)
    bundles = [f for f in manifest.files if f.endswith(".kdb")]
    bundle_target = None
    if len(bundles) == 1:
        try:
            bundle_target = Target.parse(bundles[0].removesuffix(".kdb"))
        except KdbError:
            pass
    if bundle_target is None:
        return Candidate(path, "wheel", manifest.target, manifest.version,
                         damaged=f"its manifest lists {len(bundles)} bundles, not one <target>.kdb")
    # The manifest names no code object version: a HIP wheel made for this kdbkit (_fit checks) holds
    # what its builder writes, the one version it lets through (runtime/preflight.py says more).
    return Candidate(path, "wheel", manifest.target, manifest.version, bundle_target, manifest.sources,
                     manifest.kdbkit, compiler=manifest.compiler, package=manifest.package, part=manifest.part,
                     parts=manifest.parts, manifest_sha256=hashlib.sha256(text).hexdigest(),
                     part_manifests=manifest.others,
                     code_objects=CODE_OBJECT_VERSION if bundle_target.backend == "hip" else None)


def _with_parts(found: list[Candidate]) -> list[Candidate]:
    """Each split package's first part with its other parts attached (``others``), those parts
    no longer candidates of their own; a first part whose others are not all here, and a part
    whose first part is not, are damaged, with why."""
    parts = {(c.package, c.version, c.manifest_sha256): c for c in reversed(found) if c.part > 1 and not c.damaged}
    out = []
    for c in found:
        if c.damaged or c.parts == 1:
            out.append(c)
        elif c.part == 1:
            names = [package_name(c.target, k) for k in range(2, c.parts + 1)]
            others = [parts.get((name, c.version, c.part_manifests[name])) for name in names]
            missing = [k for k, o in enumerate(others, 2) if o is None]
            if missing:
                out.append(replace(c, damaged=f"part {missing[0]} of its {c.parts} "
                                              f"({package_name(c.target, missing[0])} {c.version}) is not here"))
            else:
                out.append(replace(c, others=tuple(o.path for o in others)))
    claimed = {(name, c.version, digest) for c in found if not c.damaged for name, digest in c.part_manifests.items()}
    orphans = [replace(c, damaged=f"part {c.part} of {c.parts} of {package_name(c.target)} {c.version}, whose "
                                  "first part is not here") for c in found
               if not c.damaged and c.part > 1 and (c.package, c.version, c.manifest_sha256) not in claimed]
    return sorted(out + orphans, key=lambda c: c.path)


def _bundle(path: Path) -> Candidate:
    try:
        with open_bundle(path) as bundle:
            md = bundle.metadata
            code_objects = bundle_code_object_version(bundle)
    except KdbError as exc:
        return Candidate(path, "bundle", damaged=exc.problem)
    if md.target is None or not md.compiler:
        return Candidate(path, "bundle", damaged="names no target or compiler (not written by kdbkit)")
    return Candidate(path, "bundle", md.target, "", md.target, md.source_digests, compiler=md.compiler,
                     code_objects=code_objects)


def choose(device: Target, candidates: Iterable[Candidate], *, search_path: KernelSearchPath | None = None,
           runtime: DeviceRuntime | None = None) -> Choice:
    """The best candidate for ``device`` and the reason each other one was not taken; with
    ``runtime`` (the device's driver), one whose binaries that driver cannot load is rejected too."""
    search_path = search_path or KernelSearchPath()
    ranked, rejected = [], []
    for candidate in candidates:
        reason, rank = _fit(device, candidate, search_path)
        if not reason and runtime is not None:
            reason = refusal(candidate.compiler, runtime, code_objects=candidate.code_objects)
        if reason:
            rejected.append((candidate, reason))
        else:
            ranked.append((rank, candidate.kind != "wheel", _newest_first(candidate.version), str(candidate.path),
                           candidate))
    ranked.sort(key=lambda r: r[:4])
    if not ranked:
        return Choice(device, None, None, rejected)
    best = ranked[0]
    rejected += [(r[-1], f"a better candidate was chosen: {best[-1].path.name}") for r in ranked[1:]]
    return Choice(device, best[-1], best[0], rejected)


def _fit(device: Target, c: Candidate, search_path: KernelSearchPath) -> tuple[str, int]:
    """(why ``c`` cannot serve ``device`` or "", its rank)."""
    if c.damaged:
        return f"damaged: {c.damaged}", 0
    mismatch = device.accepts(c.bundle_target)
    if mismatch:
        return f"its bundle is for {c.bundle_target}: {mismatch}", 0
    rank = 0 if c.target == device else 1 if c.target.cu is None else 2
    if c.target.cu is not None and c.target.cu != device.cu and c.bundle_target.cu is not None:
        return f"built for {c.target.cu} CUs, this GPU has {device.cu}", 0
    if c.kdbkit:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            if __version__ not in SpecifierSet(c.kdbkit):
                return f"made for kdbkit {c.kdbkit}; this is kdbkit {__version__}", 0
        except InvalidSpecifier:
            return f"damaged: its kdbkit range {c.kdbkit!r} is not a version specifier", 0
    stale = _stale_sources(c.sources, search_path)
    if stale:
        listed = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        return (f"built from other kernel sources than these ({len(stale)} of {len(c.sources)} files differ: "
                f"{listed}), so its programs would compile anyway"), 0
    return "", rank


def _stale_sources(sources: dict[str, str], search_path: KernelSearchPath) -> list[str]:
    stale = []
    for name, digest in sorted(sources.items()):
        try:
            if search_path.digest(name) != digest:
                stale.append(name)
        except KernelSourceError:
            stale.append(name)
    return stale


def _newest_first(version: str):
    from packaging.version import InvalidVersion, Version

    try:
        return tuple(-p for p in Version(version).release) if version else (1,)
    except InvalidVersion:
        return (1,)
