"""Install kernel packages and bundles for the local GPUs (``kdb install``).

Every chosen candidate is verified before anything is installed, so a failed check leaves the
environment as it was:

- a ``SHA256SUMS`` file beside it or above it (as ``kdb package`` writes one) must list the
  file with its digest: where there is one, a file it does not list is refused, since anyone who
  can add a file to the folder could add a newer version; ``require_hashes`` makes one mandatory;
- a wheel must be data only (:mod:`kdbkit.packager.wheel_checks`): its members' sizes within
  caps before anything is read, plain files inside its package folder or its ``.dist-info``
  (no ``..``, no absolute path, no link), exactly the members ``kdb package`` writes, its
  generated ones byte for byte, each matching its SHA-256 in ``RECORD`` (the wheel project's
  :class:`~wheel.wheelfile.WheelFile` checks them as it reads), and each file its manifest lists
  matching the manifest's SHA-256 and size, streamed to a temporary file; with trusted keys
  (``--trusted-key``), its ``manifest.json.sig`` verifying under one of them (bare bundles,
  which carry no signature, are refused then);
- a bundle (bare, or in a wheel) must pass :func:`kdbkit.kdb.verify.verify_bundle`: SQLite
  integrity, its metadata and every entry's hash;
- a package split by size is installed whole: each of its other parts passes every check above
  and must be the very part the first one names (by its manifest's SHA-256), and parts an earlier
  version of the package left are uninstalled after pip installs these.

Wheels are installed through pip into the running environment (``--no-deps``: kdbkit is here,
and the version range was checked), each named with its SHA-256 so that pip installs the file
that was checked and records which wheel it was (``kdb lock`` reads that). Bare bundles, with a
find-db of the same name beside them, are copied into the system db folder
(``<sys.prefix>/share/kdbkit/db``) atomically.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kdbkit.kdb import signing
from kdbkit.kdb.file_hash import sha256_of
from kdbkit.kdb.find_db import SYSTEM_SUFFIX
from kdbkit.kdb.signing import PublicKey
from kdbkit.kdb.verify import verify_bundle
from kdbkit.packager.select import Candidate, wheel_candidate
from kdbkit.packager import wheel_checks as checks
from kdbkit.packager.provenance import FILE as PROVENANCE
from kdbkit.packager.wheel import (MANIFEST, SIGNATURE, Manifest, dist_info_name, generated_members, module_name,
                                   package_name, wheel_name)
from kdbkit.packager.errors import PackageError

SUMS_FILE = "SHA256SUMS"


def default_db_dir() -> Path:
    """Where bare bundles go: the folder the runtime searches in this environment."""
    return Path(sys.prefix) / "share" / "kdbkit" / "db"


def write_sums(folder: Path, files: list[Path]) -> Path:
    """``SHA256SUMS`` for ``files`` (in ``sha256sum``'s format, so `sha256sum -c` reads it too),
    merged with the lines an existing one holds for other files."""
    path = folder / SUMS_FILE
    sums = read_sums(folder)
    sums.update({f.name: sha256_of(f) for f in files})
    path.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items())), encoding="utf-8")
    return path


def read_sums(folder: Path) -> dict[str, str]:
    """The digests a folder's ``SHA256SUMS`` lists, by file name (empty without one).

    Raises:
        PackageError: a line that is not ``<64 hex digits>  <name>``.
    """
    path = folder / SUMS_FILE
    if not path.is_file():
        return {}
    sums = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise PackageError(f"{path}:{number}: not a `<sha256>  <file>` line", "regenerate it with `kdb package`")
        sums[name.lstrip("*")] = digest.lower()
    return sums


def verify(candidate: Candidate, *, root: Path | None = None, require_hashes: bool = False,
           trusted_keys: Sequence[PublicKey] | None = None) -> None:
    """Check ``candidate`` as the module docstring says; nothing is installed here.

    Args:
        root: the folder the candidates were found in: a ``SHA256SUMS`` there or in any folder
            between it and the candidate must list the candidate (by its path from that folder).
        require_hashes: refuse a candidate no ``SHA256SUMS`` lists, even where there is none.
        trusted_keys: where given (``--trusted-key``), refuse a wheel whose manifest is not signed
            by one of these keys, and every bare bundle (it carries no signature).

    Raises:
        PackageError: naming the file and what does not match.
    """
    files = list(candidate.wheels)  # a split package's parts are checked, and installed, with it
    if candidate.kind == "bundle":  # its find-db is copied with it
        find_db = _find_db_of(candidate.path)
        files += [find_db] if find_db.is_file() else []
    if trusted_keys is not None and candidate.kind != "wheel":
        raise PackageError(f"{candidate.path}: a bare bundle carries no signature, and --trusted-key accepts only "
                           "signed packages", "package it with `kdb package --sign KEY` and install the wheel")
    for file in files:
        _check_listed(file, root, require_hashes)
    if candidate.kind == "wheel":
        _verify_wheel(candidate, trusted_keys)
        for k, other in enumerate(candidate.others, 2):
            part = wheel_candidate(other)
            _check_part(candidate, part, k)
            _verify_wheel(part, trusted_keys)
    else:
        _verify_bundle_file(candidate.path, candidate.path)


def _check_part(first: Candidate, part: Candidate, k: int) -> None:
    """Refuse a wheel found as part ``k`` of ``first``'s package that says otherwise about itself."""
    if part.damaged:
        raise PackageError(f"{part.path}: {part.damaged}", "copy the package's wheels again")
    said = (part.package, part.part, part.parts, part.version, part.manifest_sha256)
    name = package_name(first.target, k)
    if said != (name, k, first.parts, first.version, first.part_manifests.get(name)):
        raise PackageError(f"{part.path}: not the part {k} of {first.parts} that {first.path.name} names (its "
                           "manifest's SHA-256 differs: another build's, or altered)",
                           "install the wheels that one `kdb package` wrote together")


def _check_listed(path: Path, root: Path | None, require_hashes: bool) -> None:
    listed, sums = _listed_digest(path, root)
    if listed is None and sums is not None:
        raise PackageError(f"{path}: not listed in {sums}, so not installed (a file added beside the packages "
                           "is never trusted)", "remove it from the folder, or list it: `kdb package` writes "
                           "SHA256SUMS with the wheels")
    if listed is None and require_hashes:
        raise PackageError(f"{path}: no {SUMS_FILE} lists it (--require-hashes)",
                           f"install from the folder `kdb package` wrote, with its {SUMS_FILE}")
    if listed is not None and sha256_of(path) != listed:
        raise PackageError(f"{path}: its SHA-256 does not match {sums}",
                           "download or copy the file again; do not install it")


def _listed_digest(path: Path, root: Path | None) -> tuple[str | None, Path | None]:
    """The digest a ``SHA256SUMS`` lists for ``path`` (in its folder, else in a folder above it,
    up to ``root``) and that file; (None, the nearest ``SHA256SUMS``) when none lists it."""
    folder, nearest = path.parent, None
    top = Path(os.path.abspath(root)) if root is not None else None
    while True:
        sums = folder / SUMS_FILE
        if sums.is_file():
            nearest = nearest or sums
            listed = read_sums(folder).get(path.relative_to(folder).as_posix())
            if listed is not None:
                return listed, sums
        if top is None or Path(os.path.abspath(folder)) == top or folder.parent == folder:
            return None, nearest
        folder = folder.parent


def _find_db_of(bundle: Path) -> Path:
    return bundle.with_name(bundle.name.removesuffix(".kdb") + SYSTEM_SUFFIX)


def _verify_wheel(candidate: Candidate, trusted_keys: Sequence[PublicKey] | None = None) -> None:
    from wheel.wheelfile import WheelError, WheelFile

    path = candidate.path
    try:
        with zipfile.ZipFile(path) as plain:
            infos = plain.infolist()
        checks.check_sizes(path, infos)  # before WheelFile reads RECORD, or anything else is read
        with WheelFile(path) as wheel:
            _verify_wheel_members(candidate, wheel, infos, trusted_keys)
    except WheelError as exc:  # a member that does not match RECORD, or no RECORD
        raise PackageError(f"{path}: {exc}", "the wheel is damaged or was altered; do not install it") from None
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise PackageError(f"{path}: not a readable wheel ({exc})", "download or copy it again") from None


def _verify_wheel_members(candidate: Candidate, wheel, infos: list[zipfile.ZipInfo],
                          trusted_keys: Sequence[PublicKey] | None = None) -> None:
    path, module, dist_info = candidate.path, module_name(candidate.target, candidate.part), wheel.dist_info_path
    for info in infos:
        checks.check_member_path(path, info, module, dist_info)
    by_name = {info.filename: info for info in infos}
    manifest_info = by_name.get(f"{module}/{MANIFEST}")
    if manifest_info is None:
        raise PackageError(f"{path}: no {module}/{MANIFEST}", "rebuild it with `kdb package`")
    manifest_bytes = checks.read_text_member(wheel, path, manifest_info)
    manifest = Manifest.from_json(manifest_bytes.decode("utf-8", "replace"), str(path))
    target, version, part = manifest.target, manifest.version, manifest.part
    if (manifest.package != package_name(target, part) or module_name(target, part) != module
            or path.name != wheel_name(target, version, part) or dist_info != dist_info_name(target, version, part)):
        raise PackageError(f"{path}: its name, folders and manifest ({manifest.package} {version}) disagree",
                           "rebuild it with `kdb package`; do not rename a kernel wheel")
    for name in manifest.files:
        if name == PROVENANCE:
            continue
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith((".kdb", SYSTEM_SUFFIX)):
            raise PackageError(f"{path}: its manifest lists {name!r}, not a bundle or find-db",
                               "the wheel is unsafe; do not install it")
    data = {f"{module}/{name}": name for name in manifest.files}
    generated = generated_members(target, version, manifest.compiler, part, manifest.parts)
    signature_name = f"{module}/{SIGNATURE}"
    signed = {signature_name} if signature_name in by_name else set()  # optional, but only in its exact form
    checks.check_members(path, [info.filename for info in infos], set(data) | set(generated) | signed
                         | {manifest_info.filename, f"{dist_info}/WHEEL", wheel.record_path})
    signature = checks.check_signature(path, signature_name, checks.read_text_member(
        wheel, path, by_name[signature_name])) if signed else None
    if trusted_keys is not None:
        _check_signed(path, manifest.package, manifest_bytes, signature, trusted_keys)
    checks.check_sizes(path, infos, {m for m, name in data.items() if name != PROVENANCE})
    for name, expected in [*generated.items(), (f"{dist_info}/WHEEL", None)]:
        checks.check_generated(path, name, checks.read_text_member(wheel, path, by_name[name]), expected)
    with tempfile.TemporaryDirectory() as tmp:
        for member, name in data.items():
            copy, entry = Path(tmp) / name, manifest.files[name]
            with open(copy, "wb") as dest:
                digest, size = checks.copy_data_member(wheel, path, by_name[member], dest)
            if digest != entry.get("sha256") or size != entry.get("size"):
                raise PackageError(f"{path}: {name} does not match the SHA-256 in its manifest",
                                   "the package was altered; rebuild it with `kdb package`")
            if name.endswith(".kdb"):
                _verify_bundle_file(copy, f"{path}:{name}")


def _check_signed(path: Path, package: str, manifest: bytes, signature: tuple[str, bytes] | None,
                  trusted_keys: Sequence[PublicKey]) -> None:
    """Refuse a package whose manifest no trusted key signed (its data files are then checked
    against the manifest's SHA-256, so the signature covers them)."""
    trusted = ", ".join(k.key_id for k in trusted_keys) or "none"
    if signature is None:
        raise PackageError(f"{path}: {package} is not signed (no {SIGNATURE}), and --trusted-key accepts only signed "
                           "packages", "ask its publisher for a package made with `kdb package --sign KEY`")
    key_id, sig = signature
    if not any(k.key_id == key_id for k in trusted_keys):
        raise PackageError(f"{path}: {package} is signed by key {key_id}, which is not trusted (trusted: {trusted})",
                           "pass the signer's public key with --trusted-key, if you trust it")
    if signing.verify(manifest, sig, trusted_keys, key_id) is None:
        raise PackageError(f"{path}: {package}'s signature does not verify under key {key_id} (its manifest or "
                           "signature was altered)", "the package was altered; do not install it")


def _verify_bundle_file(path: Path, what) -> None:
    report = verify_bundle(path)
    if not report.ok:
        raise PackageError(f"{what}: {report.problems[0]}" + (f" (and {len(report.problems) - 1} more problems)"
                                                             if len(report.problems) > 1 else ""),
                           "the bundle is damaged; rebuild it or copy it again")


@dataclass(frozen=True)
class Installed:
    candidate: Candidate
    where: str  # "pip" or the folder a bundle was copied into
    files: tuple[str, ...]


def install(candidate: Candidate, *, db_dir: Path | None = None) -> Installed:
    """Install a verified candidate (call :func:`verify` first).

    Raises:
        PackageError: pip failed (its last output lines in the message), or the db folder
            cannot be written.
    """
    if candidate.kind == "wheel":
        return _pip_install(candidate)
    folder = db_dir or default_db_dir()
    files = [candidate.path]
    find_db = _find_db_of(candidate.path)
    if find_db.is_file():
        files.append(find_db)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for file in files:
            _copy_atomically(file, folder / file.name)
    except OSError as exc:
        raise PackageError(f"cannot write {folder}: {exc.strerror or exc}",
                           "choose a writable folder with --into, or install as its owner") from None
    return Installed(candidate, str(folder), tuple(f.name for f in files))


def _copy_atomically(source: Path, dest: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _pip_install(candidate: Candidate) -> Installed:
    pip_install_wheels(candidate.wheels)
    _remove_other_parts(candidate)
    return Installed(candidate, "pip", tuple(w.name for w in candidate.wheels))


def _remove_other_parts(candidate: Candidate) -> None:
    """Uninstall the parts of this target's package past the ones just installed (left by an
    earlier version split into more): nothing serves a wrong binary through them, but they
    would be searched, locked and reported as installed."""
    from packaging.utils import canonicalize_name

    from kdbkit.runtime.paths import iter_kernel_packages

    ours = {canonicalize_name(package_name(candidate.target, k)) for k in range(1, candidate.parts + 1)}
    first = canonicalize_name(package_name(candidate.target))
    part = re.compile(re.escape(first) + r"-part\d+")
    stale = sorted({where.dist for where in iter_kernel_packages()
                    if canonicalize_name(where.dist) not in ours and part.fullmatch(canonicalize_name(where.dist))})
    if stale:
        _pip(["uninstall", "--yes", *stale], f"pip could not uninstall {', '.join(stale)}")


def pip_install_wheels(wheels: list[Path], digests: list[str] | None = None) -> None:
    """Install ``wheels`` into this environment with one pip command, each given as a file URL
    with its SHA-256 (``#sha256=``; ``digests``, else hashed here): pip refuses a file that
    changed since it was checked, and records the digest in the installed ``direct_url.json``,
    where ``kdb lock`` reads which wheel a package came from.

    Raises:
        PackageError: pip is missing or refused (its last output lines in the message).
    """
    digests = digests or [sha256_of(w) for w in wheels]
    urls = [f"{Path(os.path.abspath(w)).as_uri()}#sha256={d}" for w, d in zip(wheels, digests)]
    _pip(["install", "--no-deps", "--no-index", "--force-reinstall", *urls],
         f"pip could not install {', '.join(w.name for w in wheels)}")


def _pip(arguments: list[str], failed: str) -> None:
    """Run pip in this environment; PackageError with ``failed`` and pip's last lines if it fails."""
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *arguments]
    try:
        run = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise PackageError(f"cannot run pip ({exc})", "install pip into this environment") from None
    if run.returncode != 0:
        tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
        if "No module named pip" in tail:
            raise PackageError(f"pip is not available in {sys.prefix}",
                               "run `python -m ensurepip`, or give bare bundles instead of wheels")
        raise PackageError(f"{failed}: {tail}", "see pip's message; the environment is as it was before")
