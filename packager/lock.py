"""Lock an environment's kernel packages, check an environment against a lock, install exactly a lock.

- :func:`lock_environment` (``kdb lock``): every kernel package the runtime finds (through its
  ``.dist-info``, never imported: :func:`kdbkit.runtime.paths.iter_kernel_packages`), read from
  its installed ``manifest.json``, each installed bundle and find-db hashed and held to the
  manifest (an altered installation is refused, not locked).
- The wheel's SHA-256 comes from the installation itself: ``kdb install`` names each wheel to pip
  with its digest (``file://...#sha256=``), and pip records it in ``direct_url.json``
  (``archive_info.hashes``; pip 23 records it for any local wheel). A package installed without
  one (an older pip, a copied site-packages) is locked only with ``from_dir``: the wheels there of
  its name and version whose ``manifest.json`` is byte for byte the installed one are hashed,
  and must agree.
- :func:`check_environment` (``kdb doctor --locked``): every difference, one line each.
- :func:`install_locked` (``kdb install --locked``): the locked wheels found in a folder by name,
  version and SHA-256, each verified as ``kdb install`` verifies, all before pip runs once.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kdbkit.kdb import Target
from kdbkit.kdb.file_hash import sha256_of
from kdbkit.kdb.find_db import SYSTEM_SUFFIX
from kdbkit.kdb.signing import PublicKey
from kdbkit.kdb.version import __version__
from kdbkit.packager import install as installer
from kdbkit.packager.errors import LockError, PackageError
from kdbkit.packager.lock_file import Lock, LockedPackage
from kdbkit.packager.provenance import FILE as PROVENANCE
from kdbkit.packager.select import wheel_candidate
from kdbkit.packager.wheel import MANIFEST, Manifest, module_of, wheel_name_of
from kdbkit.packager.wheel_checks import MAX_TEXT_BYTES
from kdbkit.runtime.paths import KernelPackage, iter_kernel_packages

_REINSTALL = "reinstall it with `kdb install`, then lock"


@dataclass(frozen=True)
class Installed:
    """A kernel package as installed: its manifest and the bundles and find-dbs its folder holds."""

    where: KernelPackage
    manifest: Manifest
    manifest_bytes: bytes
    files: dict[str, str]  # every .kdb and .fdb in its folder -> SHA-256
    wheel_sha256: str | None  # as the installer recorded it, if it did

    @property
    def label(self) -> str:
        return f"{self.manifest.package} {self.manifest.version}"


def read_installed(where: KernelPackage) -> Installed:
    """Read one installed kernel package.

    Raises:
        LockError: its folder has no readable manifest, or the manifest and the distribution's
            name or version disagree.
    """
    path = where.folder / MANIFEST
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise LockError(f"kernel package {where.dist} ({where.folder}) has no readable {MANIFEST} "
                        f"({exc.strerror or exc})", _REINSTALL) from None
    try:
        manifest = Manifest.from_json(raw[:MAX_TEXT_BYTES].decode("utf-8", "replace"), str(where.folder))
    except PackageError as exc:
        raise LockError(exc.problem, _REINSTALL) from None
    name, version = _metadata_name_version(where.dist_info)
    from packaging.utils import canonicalize_name

    if canonicalize_name(name or "") != canonicalize_name(manifest.package) or version != manifest.version:
        raise LockError(f"{where.dist_info} says {name} {version}, its {MANIFEST} {manifest.package} "
                        f"{manifest.version}", _REINSTALL)
    files = {}
    try:
        for file in sorted(where.folder.iterdir()):
            if file.name.endswith((".kdb", SYSTEM_SUFFIX)) and file.is_file():
                files[file.name] = sha256_of(file)
    except OSError as exc:
        raise LockError(f"{manifest.package} {manifest.version}: cannot read {exc.filename or where.folder} "
                        f"({exc.strerror or exc})", "make the installed package readable, or reinstall it") from None
    return Installed(where, manifest, raw, files, _recorded_wheel_sha256(where.dist_info))


def _metadata_name_version(dist_info: Path) -> tuple[str | None, str | None]:
    name = version = None
    try:
        text = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
    except OSError:
        try:  # an .egg-info's PKG-INFO says the same
            text = (dist_info / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None, None
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key == "Name" and name is None:
            name = value.strip()
        elif key == "Version" and version is None:
            version = value.strip()
    return name, version


def _recorded_wheel_sha256(dist_info: Path) -> str | None:
    """The wheel's SHA-256 in ``direct_url.json`` (PEP 610's ``archive_info``), if pip wrote one."""
    try:
        data = json.loads((dist_info / "direct_url.json").read_text(encoding="utf-8"))
        info = data["archive_info"]
        digest = (info.get("hashes") or {}).get("sha256") or info.get("hash", "").partition("sha256=")[2]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    digest = digest.lower() if isinstance(digest, str) else ""
    return digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else None


def _manifest_problem(p: Installed) -> str:
    """Why the installed files are not the ones the package's manifest lists ("" when they are)."""
    listed = {name: entry for name, entry in p.manifest.files.items() if name != PROVENANCE}
    if PROVENANCE in p.manifest.files:  # not locked (the wheel's SHA-256 is), but part of the package
        try:
            if sha256_of(p.where.folder / PROVENANCE) != p.manifest.files[PROVENANCE].get("sha256"):
                return f"{p.where.folder / PROVENANCE} does not match the SHA-256 in its {MANIFEST}"
        except OSError:
            return f"{PROVENANCE} is missing from {p.where.folder}"
    for name in sorted(set(p.files) | set(listed)):
        if name not in p.files:
            return f"{name} is missing from {p.where.folder}"
        if name not in listed:
            return f"{p.where.folder / name} is not one of the package's files"
        if p.files[name] != listed[name].get("sha256"):
            return f"{p.where.folder / name} does not match the SHA-256 in its {MANIFEST}"
    return ""


def lock_environment(*, from_dir: Path | None = None) -> Lock:
    """The lock of the kernel packages installed here (on ``sys.path``, as the runtime finds them).

    Args:
        from_dir: a folder of wheels, for packages whose installation recorded no wheel SHA-256.

    Raises:
        LockError: a package that cannot be read, whose files differ from its manifest, or whose
            wheel is known neither from its installation nor from ``from_dir``.
    """
    locked: dict[str, LockedPackage] = {}
    for where in iter_kernel_packages():
        p = read_installed(where)
        problem = _manifest_problem(p)
        if problem:
            raise LockError(f"{p.label}: {problem}", f"the installed package was altered; {_REINSTALL}")
        digest = p.wheel_sha256 or _wheel_from(from_dir, p)
        m = p.manifest
        if m.package in locked:
            raise LockError(f"{m.package} is installed twice (again in {where.folder})",
                            "uninstall one copy (pip uninstall), then lock")
        locked[m.package] = LockedPackage(m.package, m.version, str(m.target), m.kdbkit, m.compiler, digest,
                                          dict(p.files), dict(m.sources))
    return Lock(tuple(locked[n] for n in sorted(locked)))


def _wheel_from(from_dir: Path | None, p: Installed) -> str:
    """The SHA-256 of the wheel in ``from_dir`` that ``p`` was installed from."""
    if from_dir is None:
        raise LockError(f"{p.label}: its installation records no wheel SHA-256 ({p.where.dist_info} has no "
                        "direct_url.json with one)", "give the folder of wheels it was installed from: "
                        "`kdb lock --from DIR`, or reinstall it with `kdb install`")
    want = wheel_name_of(p.manifest.package, p.manifest.version)
    found = sorted(f for f in from_dir.rglob(want) if f.is_file())
    if not found:
        raise LockError(f"{p.label}: {from_dir} holds no {want}", "give --from the folder it was installed from")
    same = [f for f in found if _wheel_manifest(f, module_of(p.manifest.package)) == p.manifest_bytes]
    if not same:
        raise LockError(f"{p.label}: {found[0]} is another build than the one installed (its {MANIFEST} differs)",
                        "give --from the folder it was installed from")
    digests = sorted({sha256_of(f) for f in same})
    if len(digests) > 1:
        raise LockError(f"{p.label}: {from_dir} holds {len(digests)} different {want} with the installed files",
                        "keep only the one it was installed from")
    return digests[0]


def _wheel_manifest(wheel: Path, module: str) -> bytes | None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(f"{module}/{MANIFEST}")
            if info.file_size > MAX_TEXT_BYTES:
                return None
            with archive.open(info) as member:
                return member.read(MAX_TEXT_BYTES + 1)
    except (KeyError, zipfile.BadZipFile, OSError, EOFError, zlib.error):
        return None


def _kdbkit_difference(p: LockedPackage) -> str:
    from packaging.specifiers import SpecifierSet

    if __version__ in SpecifierSet(p.kdbkit):  # read_lock checked it parses
        return ""
    return f"{p.label}: made for kdbkit {p.kdbkit}; this is kdbkit {__version__}"


def check_environment(lock: Lock, *, targets: Sequence[Target] | None = None) -> list[str]:
    """Every way this environment differs from ``lock``, one line each (empty: it matches).

    Checked: kdbkit's version is in each package's range; each locked package is installed at its
    version and target, from its wheel (where the installation recorded it), with exactly its
    bundles and find-dbs byte for byte, built from this kdbkit's kernel sources; and no bundle the
    lock does not hold would serve ``targets`` (default: this machine's devices), from a package,
    ``KDB_SYSTEM_DB_PATH`` or ``<sys.prefix>/share/kdbkit/db``.
    """
    from packaging.utils import canonicalize_name

    differences = [d for d in map(_kdbkit_difference, lock.packages) if d]
    installed: dict[str, Installed | LockError] = {}
    for where in iter_kernel_packages():
        try:
            installed[canonicalize_name(where.dist)] = read_installed(where)
        except LockError as exc:  # a difference only if it is locked, or would serve a device (below)
            installed[canonicalize_name(where.dist)] = exc
    locked_files = set()
    for p in lock.packages:
        found = installed.get(canonicalize_name(p.name))
        if found is None:
            differences.append(f"{p.label}: not installed")
        elif isinstance(found, LockError):
            differences.append(f"{p.label}: {found.problem}")
        else:
            differences += _package_differences(p, found)
            locked_files |= {os.path.abspath(found.where.folder / name) for name in p.files}
    return differences + _extra_bundles(locked_files, targets)


def _package_differences(p: LockedPackage, found: Installed) -> list[str]:
    m = found.manifest
    if m.version != p.version:
        return [f"{p.name}: version {m.version} installed, locked {p.version}"]
    out = [f"{p.label}: target {m.target} installed, locked {p.target}"] if str(m.target) != p.target else []
    if found.wheel_sha256 is not None and found.wheel_sha256 != p.wheel_sha256:
        out.append(f"{p.label}: installed from wheel sha256 {found.wheel_sha256} != locked {p.wheel_sha256}")
    folder = found.where.folder
    for name in sorted(set(p.files) | set(found.files)):
        if name not in found.files:
            out.append(f"{p.label}: {folder / name} is missing")
        elif name not in p.files:
            out.append(f"{p.label}: {folder / name} is not in the lock")
        elif found.files[name] != p.files[name]:
            out.append(f"{p.label}: {folder / name} sha256 {found.files[name]} != locked {p.files[name]}")
    stale = _stale_sources(p.sources)
    if stale:
        listed = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        out.append(f"{p.label}: built from other kernel sources than this kdbkit's ({len(stale)} of "
                   f"{len(p.sources)} differ: {listed}), so its programs would compile")
    return out


def _stale_sources(sources: dict[str, str]) -> list[str]:
    from kdbkit.runtime.kernel_sources import KernelSearchPath

    now = KernelSearchPath().digest_each(sources)
    return [name for name, digest in sorted(sources.items()) if now.get(name) != digest]


def _extra_bundles(locked_files: set[str], targets: Sequence[Target] | None) -> list[str]:
    """A line for each bundle outside the lock that the runtime would accept for a device."""
    from kdbkit.runtime import paths
    from kdbkit.runtime.backends.registry import binary_format_of, discover_devices
    from kdbkit.runtime.system_bundles import bundle_for_device

    try:
        devices = [(t, t.backend) for t in targets] if targets is not None else \
            [(d.target, d.backend) for d in discover_devices()]
    except Exception as exc:  # e.g. a malformed KDB_DEVICE_ARCH: a difference to report, as `kdb doctor` does
        return [f"cannot list this machine's devices ({getattr(exc, 'problem', exc)}); name them with --target"]
    dirs = paths.system_db_dirs()
    extra: dict[str, list[str]] = {}
    for target, backend in devices:
        _, trace = bundle_for_device(target, binary_format_of(backend), dirs)
        for c in trace:
            if c.status == "accepted" and os.path.abspath(c.path) not in locked_files:
                extra.setdefault(f"{c.path} ({c.origin})", []).append(str(target))
    return [f"{where}: would serve {', '.join(dict.fromkeys(served))} and is not in the lock"
            for where, served in extra.items()]


def install_locked(lock: Lock, source: Path, *, dry_run: bool = False,
                   trusted_keys: Sequence[PublicKey] | None = None) -> list[tuple[LockedPackage, Path]]:
    """Install exactly the locked packages from the wheels in ``source``, or nothing.

    Each locked package's wheel is found by name and version and must have the locked SHA-256,
    then passes every check of ``kdb install`` (with ``trusted_keys``, its signature too); pip
    runs once, after all of them.

    Returns:
        Each locked package and the wheel it was (or, with ``dry_run``, would be) installed from.

    Raises:
        LockError: the first difference: this kdbkit outside a package's range, a package with
            no wheel in ``source``, only other versions, or a wheel whose SHA-256 differs.
        PackageError: a locked wheel fails verification, or pip fails.
    """
    if not source.is_dir():
        raise PackageError(f"{source} is not a folder", "give --from the folder holding the locked wheels")
    for p in lock.packages:
        difference = _kdbkit_difference(p)
        if difference:
            raise LockError(difference, "install the kdbkit the lock was written with, or lock again")
    chosen = [(p, _locked_wheel(p, source)) for p in lock.packages]
    for p, wheel in chosen:  # every check before anything is installed
        candidate = wheel_candidate(wheel)
        if candidate.damaged or candidate.package != p.name:
            raise LockError(f"{p.label}: {wheel} is {candidate.damaged or 'another package'}",
                            "the locked wheel itself is damaged: build the packages again and lock again")
        installer.verify(candidate, root=source, trusted_keys=trusted_keys)
    if chosen and not dry_run:
        installer.pip_install_wheels([w for _, w in chosen], [p.wheel_sha256 for p, _ in chosen])
    return chosen


def _locked_wheel(p: LockedPackage, source: Path) -> Path:
    want, module = wheel_name_of(p.name, p.version), module_of(p.name)
    found = sorted(f for f in source.rglob(want) if f.is_file())
    remedy = "copy the locked wheels into the folder, or lock again after installing these"
    if not found:
        tail = "-py3-none-any.whl"
        others = sorted({f.name[len(module) + 1:-len(tail)] for f in source.rglob(f"{module}-*{tail}")
                         if "-" not in f.name[len(module) + 1:-len(tail)]})
        if others:
            raise LockError(f"{p.label}: {source} has version {', '.join(others)}, not the locked {p.version}",
                            remedy)
        raise LockError(f"{p.label}: not in {source} (no {want})", remedy)
    digests = [(sha256_of(f), f) for f in found]
    for digest, wheel in digests:
        if digest == p.wheel_sha256:
            return wheel
    digest, wheel = digests[0]
    raise LockError(f"{p.label}: wheel sha256 {digest} != locked {p.wheel_sha256} ({wheel})",
                    "it is not the wheel that was locked: " + remedy)
