"""Kernel packages: a target's bundle (and its tuned find-db) as a pip-installable wheel.

A package ``kdbkit-kernels-<arch>[-<cu>]`` holds one import folder, ``kdbkit_kernels_<arch>[_<cu>]/``:

- the bundle (``sm_90.kdb``, or ``sm_90_132.kdb`` for programs built for one CU count);
- the system find-db tuned for the exact GPU (``sm_90_132.fdb``), when there is one: it is why a
  package carries a CU count, since rankings depend on the device while binaries do not;
- ``provenance.intoto.json``: an in-toto statement of how it was built (:mod:`.provenance`);
- ``manifest.json``: the target, the kdbkit versions it works with, the compiler, the SHA-256 and
  size of every file (the provenance's too), and the bundle's kernel-source manifest (what it
  was built from);
- ``manifest.json.sig``, where it was signed (``kdb package --sign``): see :func:`write_package`;
- ``__init__.py`` with ``bundle_dir()``, for a caller who wants the folder from Python.

A bundle too large for one wheel is split by size into parts (:mod:`kdbkit.kdb.split`), one
package each: ``kdbkit-kernels-sm_90-132``, then ``kdbkit-kernels-sm_90-132-part2``, ... Each is a
complete package of the layout above holding some of the entries; the first also carries the
find-db, and its manifest gives ``part``, ``parts`` and ``others`` (each other part's name and the
SHA-256 of its manifest); the others' give ``part`` and ``parts``. An unsplit package's manifest
has none of these, as before parts existed.

The entry point in group ``kdbkit.bundles`` names the import folder only (``<module> = <module>``):
the runtime locates that folder beside the distribution's ``.dist-info`` and never imports it
(runtime/paths.py), and ``kdb install`` refuses a wheel whose generated files differ by one byte
from what :func:`generated_members` makes, so a kernel package is data and runs no code.

``RECORD`` lists each member's SHA-256 (the installer reads the wheel with the ``wheel``
project's :class:`~wheel.wheelfile.WheelFile`, which checks them all).

The same bundle gives the same wheel, byte for byte, on any machine, in any folder, at any time:
members in a fixed order (the package's files sorted, then the ``.dist-info`` files sorted,
``RECORD`` last), each dated ``SOURCE_DATE_EPOCH`` where it is set, else 1980-01-01
(:func:`kdbkit.kdb.reproducible.zip_date_time`), mode 0644, made "on Unix" whatever the
system, and deflated by Python's zlib (whose version the bytes also depend on).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from kdbkit.kdb import Target, open_bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.find_db import SYSTEM_SUFFIX, USER_SUFFIX, configs_in, system_file_name
from kdbkit.kdb.reproducible import zip_date_time
from kdbkit.kdb.signing import Signer, detached_signature
from kdbkit.kdb.version import __version__
from kdbkit.packager import provenance
from kdbkit.packager.errors import PackageError

PACKAGE_PREFIX = "kdbkit-kernels-"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"  # `kdb package --sign`: the key id and Ed25519 signature over manifest.json's bytes
MANIFEST_FORMAT = 1
MAX_PARTS = 999  # a split package's wheels: far more than any target needs, few enough to list
# The group runtime/paths.py reads, spelled again there: the runtime does not import the packager.
ENTRY_POINT_GROUP = "kdbkit.bundles"


def compatible_versions(version: str = __version__) -> str:
    """The kdbkit versions a package built by ``version`` works with: the same minor release
    (kernel sources change between minors; within one, the manifest still catches an edit)."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return f">={version},<{major}.{minor + 1}"


def package_name(target: Target, part: int = 1) -> str:
    """``kdbkit-kernels-sm_90-132`` for ``sm_90_132``, ``kdbkit-kernels-gfx942`` arch-wide; a
    target feature is spelled out, since a name cannot hold ``:``, ``+`` or a trailing ``-``
    (``gfx90a:xnack-`` is ``gfx90a-xnack-off``). The parts after the first of a split package
    add ``-part<N>`` (``kdbkit-kernels-sm_90-132-part2``): the first keeps the plain name, so a
    package's name does not change with the number of its parts."""
    features = "".join(f"-{f[:-1]}-{'on' if f.endswith('+') else 'off'}" for f in target.features)
    return (PACKAGE_PREFIX + target.arch + features + (f"-{target.cu}" if target.cu is not None else "")
            + (f"-part{part}" if part > 1 else ""))


def module_of(package: str) -> str:
    """A package's import folder: its name with every other character an underscore."""
    return re.sub(r"[^a-z0-9]+", "_", package.lower()).strip("_")


def module_name(target: Target, part: int = 1) -> str:
    """The import folder of ``target``'s package (or of its ``part``)."""
    return module_of(package_name(target, part))


@dataclass(frozen=True)
class Split:
    """A bundle packaged as one part of a larger one (:func:`write_package`)."""

    part: int
    parts: int
    whole: Path  # the bundle it was split from, whose build record the parts share
    whole_sha256: str
    target: Target  # every part's package is for the first's target (its find-db's GPU, where it has one)
    others: dict[str, str] | None = None  # the first part's: each other part's package -> its manifest's SHA-256


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says."""

    package: str
    version: str
    target: Target
    kdbkit: str  # the versions it works with, a PEP 440 specifier
    compiler: str
    files: dict[str, dict]  # name -> {"sha256": hex, "size": bytes}
    sources: dict[str, str]  # kernel file -> digest of the source its bundle was built from
    part: int = 1  # of a package split into `parts` wheels (kdb package --max-wheel-size)
    parts: int = 1
    # The first part's: each other part's package and the SHA-256 of its manifest, which lists
    # the SHA-256 of its files: the first part (and its signature) vouches for the whole set.
    others: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        split = {"part": self.part, "parts": self.parts} if self.parts > 1 else {}  # unsplit: as before splits
        split.update({"others": self.others} if self.others else {})
        return json.dumps({"format": MANIFEST_FORMAT, "package": self.package, "version": self.version,
                           "target": str(self.target), "kdbkit": self.kdbkit, "compiler": self.compiler,
                           "files": self.files, "sources": self.sources, **split}, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> "Manifest":
        """Raises: PackageError naming ``where`` when the text is not a manifest this kdbkit reads."""
        try:
            data = json.loads(text)
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, this kdbkit reads {MANIFEST_FORMAT}")
            part, parts, others = data.get("part", 1), data.get("parts", 1), data.get("others", {})
            if not (type(part) is int and type(parts) is int and 1 <= part <= parts <= MAX_PARTS):
                raise ValueError(f"part {part!r} of {parts!r} is not a part number")
            target = Target.parse(data["target"])
            if part == 1 and sorted(others) != sorted(package_name(target, k) for k in range(2, parts + 1)):
                raise ValueError(f"a first part of {parts} names other parts {sorted(others)}")
            if part > 1 and others:
                raise ValueError(f"part {part} names other parts")
            return cls(str(data["package"]), str(data["version"]), target, str(data["kdbkit"]),
                       str(data["compiler"]), dict(data["files"]), dict(data["sources"]), part, parts,
                       {str(k): str(v) for k, v in others.items()})
        except (ValueError, KeyError, TypeError, AttributeError, KdbError) as exc:
            raise PackageError(f"{where}: {MANIFEST} is not a kernel-package manifest ({exc})",
                           "rebuild the package with `kdb package`") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def package_target(bundle_target: Target, find_db: Path | None) -> Target:
    """The target a package is for: the bundle's, or the find-db's exact GPU when the bundle is
    arch-wide and the find-db was tuned on one.

    Raises:
        PackageError: the find-db is for another arch, or its name is not ``<target>.fdb``.
    """
    if find_db is None:
        return bundle_target
    try:
        tuned = Target.parse(find_db.name.removesuffix(SYSTEM_SUFFIX).removesuffix(USER_SUFFIX))
    except KdbError:
        raise PackageError(f"{find_db}: a find-db is named for its GPU (<arch>_<cu>.fdb, as `kdb tune` writes it)",
                       "rename it, or run `kdb tune` on the GPU") from None
    if tuned.arch_wide() != bundle_target.arch_wide() or (bundle_target.cu is not None and tuned != bundle_target):
        raise PackageError(f"{find_db} was tuned for {tuned}, but the bundle is for {bundle_target}",
                       "package a find-db tuned on a GPU of the bundle's target")
    return tuned


def write_package(bundle: Path, out: Path, *, find_db: Path | None = None, version: str = __version__,
                  signer: Signer | None = None, provenance_host: bool = False, split: Split | None = None) -> Path:
    """Write the wheel of ``bundle`` (and ``find_db``) into folder ``out``; return its path.

    With ``split``, ``bundle`` is one part of a bundle split by size (:mod:`kdbkit.kdb.split`),
    packaged as part ``split.part`` of ``split.parts`` (:func:`package_name`); the first part
    carries the find-db, names the SHA-256 of each other part's manifest (so the others are
    written first), and requires them at the same version, so that pip installs them together
    too. Each part has its own manifest, provenance and signature.

    With ``signer``, the wheel also holds ``<module>/manifest.json.sig``: the signer's key id and
    its Ed25519 signature over ``manifest.json``'s exact bytes, which list every data file's
    SHA-256, so the signature covers them all (``kdb install --trusted-key``, ``KDB_TRUSTED_KEYS``).
    Every wheel holds ``<module>/provenance.intoto.json`` (:mod:`kdbkit.packager.provenance`;
    ``provenance_host`` records this machine's name in it), listed in the manifest.

    Raises:
        PackageError: the bundle does not open or names no target, or the find-db does not fit it.
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    with open_bundle(bundle) as opened:
        md = opened.metadata
    if md.target is None or not md.compiler:
        raise PackageError(f"{bundle}: names no target or compiler (not written by kdbkit)",
                       "build it with `kdb build`, or merge it into one that does")
    target = package_target(md.target, find_db)
    part, parts = (split.part, split.parts) if split else (1, 1)
    if split is not None:
        if split.target.arch_wide() != md.target.arch_wide() or (find_db is not None and target != split.target):
            raise PackageError(f"{bundle}: part {part} is for {md.target}, its package for {split.target}",
                               "split the bundle with kdbkit.kdb.split and package its parts together")
        target = split.target
    if find_db is not None and part > 1:
        raise PackageError(f"{find_db}: a split package's find-db goes with its first part", "give it to part 1")
    files = {md.target.bundle_name(): bundle.read_bytes()}
    if find_db is not None:
        configs_in(find_db)  # refuses a file that is not a find-db, naming it
        files[system_file_name(target)] = find_db.read_bytes()
    name, module = package_name(target, part), module_name(target, part)
    digests = {f: _sha256(data) for f, data in files.items()}
    # a part's build record is the whole bundle's, which the build described
    record = (provenance.read_build_record(split.whole, split.whole_sha256) if split else
              provenance.read_build_record(bundle, digests[md.target.bundle_name()]))
    files[provenance.FILE] = provenance.statement(
        digests, md, package=name, version=version, target=str(target), host=provenance_host, record=record,
        split={"part": part, "parts": parts, "bundleSha256": split.whole_sha256} if split else None)
    manifest = Manifest(name, version, target, compatible_versions(version), md.compiler,
                        {f: {"sha256": _sha256(data), "size": len(data)} for f, data in sorted(files.items())},
                        md.source_digests, part, parts, dict(split.others or {}) if split else {})
    members = {f"{module}/{f}": data for f, data in files.items()}
    members[f"{module}/{MANIFEST}"] = manifest.to_json().encode()
    if signer is not None:  # Ed25519 is deterministic: the same key and manifest give the same bytes
        members[f"{module}/{SIGNATURE}"] = detached_signature(signer, members[f"{module}/{MANIFEST}"])
    members.update(generated_members(target, version, md.compiler, part, parts))
    dist_info = dist_info_name(target, version, part)
    members[f"{dist_info}/WHEEL"] = wheel_file_text(__version__).encode()
    # The package's files, then the dist-info's, as the wheel spec wants; RECORD last.
    ordered = sorted(members, key=lambda name: (name.startswith(f"{dist_info}/"), name))
    record = f"{dist_info}/RECORD"
    members[record] = record_text(record, [(name, members[name]) for name in ordered])
    when = zip_date_time()
    out.mkdir(parents=True, exist_ok=True)
    path = out / wheel_name(target, version, part)
    with tempfile.TemporaryDirectory(dir=out, prefix=".kdb-package-") as tmp:
        written = Path(tmp) / path.name
        with zipfile.ZipFile(written, "w") as wheel:
            for name in [*ordered, record]:
                wheel.writestr(_member_info(name, when), members[name])
        written.replace(path)
    return path


def manifest_sha256(wheel: Path) -> str:
    """The SHA-256 of the manifest a kernel wheel written by :func:`write_package` holds.

    Raises:
        PackageError: the wheel holds no single manifest.
    """
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith("/" + MANIFEST) and n.count("/") == 1]
        if len(names) != 1:
            raise PackageError(f"{wheel}: holds {len(names)} {MANIFEST} files, not one", "write it with kdb package")
        return _sha256(archive.read(names[0]))


def _member_info(name: str, when: tuple[int, ...]) -> zipfile.ZipInfo:
    """A member's header: every field fixed, none taken from the clock or the system."""
    info = zipfile.ZipInfo(name, date_time=when)
    info.external_attr = (0o644 | stat.S_IFREG) << 16
    info.create_system = 3  # Unix: zipfile says 0 on Windows, which would change the bytes there
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def record_text(record: str, members: list[tuple[str, bytes]]) -> bytes:
    """``RECORD``: each member's path, ``sha256=`` and its urlsafe base64 digest without padding,
    and size, one a line in the order given; then RECORD itself with neither."""
    def line(name: str, data: bytes) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(data)}\n"
    return ("".join(line(name, data) for name, data in members) + f"{record},,\n").encode()


def wheel_name(target: Target, version: str, part: int = 1) -> str:
    return wheel_name_of(package_name(target, part), version)


def wheel_name_of(package: str, version: str) -> str:
    return f"{module_of(package)}-{version}-py3-none-any.whl"


def dist_info_name(target: Target, version: str, part: int = 1) -> str:
    return f"{module_name(target, part)}-{version}.dist-info"


def wheel_file_text(generator_version: str) -> str:
    """The wheel's ``WHEEL`` file; only the version of the kdbkit that packaged it varies."""
    return (f"Wheel-Version: 1.0\nGenerator: kdbkit {generator_version}\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n")


def generated_members(target: Target, version: str, compiler: str, part: int = 1, parts: int = 1) -> dict[str, bytes]:
    """The members a kernel wheel for ``target`` (part ``part`` of ``parts``) holds besides its
    data files, manifest and ``WHEEL``, by their path in the wheel, exactly as
    :func:`write_package` writes them: the installer compares a wheel's members with these byte
    for byte."""
    module, dist_info = module_name(target, part), dist_info_name(target, version, part)
    others = [package_name(target, k) for k in range(2, parts + 1)] if part == 1 else []
    return {f"{module}/__init__.py": _init_py(target).encode(),
            f"{dist_info}/METADATA": _metadata(package_name(target, part), version, target, compiler,
                                               f" (part {part} of {parts})" if parts > 1 else "", others).encode(),
            f"{dist_info}/entry_points.txt": f"[{ENTRY_POINT_GROUP}]\n{module} = {module}\n".encode()}


def _init_py(target: Target) -> str:
    return (f'"""Precompiled kdbkit kernels for {target} (a kernel package: `kdb install` installs it)."""\n\n'
            "import os\n\n\n"
            "def bundle_dir() -> str:\n"
            '    """The folder holding this package\'s bundle and find-db (entry point kdbkit.bundles)."""\n'
            "    return os.path.dirname(os.path.abspath(__file__))\n")


def _metadata(name: str, version: str, target: Target, compiler: str, part: str, others: list[str]) -> str:
    return (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: kdbkit kernel bundle for {target} ({compiler}){part}\n"
            f"Requires-Dist: kdbkit{compatible_versions(version)}\n"
            + "".join(f"Requires-Dist: {other}=={version}\n" for other in others))
