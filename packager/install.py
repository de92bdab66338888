"""Install kernel packages and bundles for the local GPUs (``kdb install``).

Every chosen candidate is verified before anything is installed, so a failed check leaves the
environment as it was:

- a ``SHA256SUMS`` file beside it (as ``kdb package`` writes one) must list the file's digest;
- a wheel's members must be plain files inside its package folder or its ``.dist-info`` (no
  ``..``, no absolute path, no link), each must match its SHA-256 in ``RECORD`` (the wheel
  project's :class:`~wheel.wheelfile.WheelFile` checks them as it reads), and each file its
  manifest lists must match the manifest's SHA-256 and size;
- a bundle (bare, or in a wheel) must pass :func:`kdbkit.kdb.verify.verify_bundle`: SQLite
  integrity, its metadata and every entry's hash.

Wheels are installed through pip into the running environment (``--no-deps``: kdbkit is here,
and the version range was checked). Bare bundles, with a find-db of the same name beside
them, are copied into the system db folder (``<sys.prefix>/share/kdbkit/db``) atomically.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kdbkit.kdb.find_db import SYSTEM_SUFFIX
from kdbkit.kdb.verify import verify_bundle
from kdbkit.packager.select import Candidate
from kdbkit.packager.wheel import MANIFEST, Manifest, module_name
from kdbkit.packager.errors import PackageError

SUMS_FILE = "SHA256SUMS"


def default_db_dir() -> Path:
    """Where bare bundles go: the folder the runtime searches in this environment."""
    return Path(sys.prefix) / "share" / "kdbkit" / "db"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def verify(candidate: Candidate) -> None:
    """Check ``candidate`` as the module docstring says; nothing is installed here.

    Raises:
        PackageError: naming the file and what does not match.
    """
    listed = read_sums(candidate.path.parent).get(candidate.path.name)
    if listed is not None and sha256_of(candidate.path) != listed:
        raise PackageError(f"{candidate.path}: its SHA-256 does not match {candidate.path.parent / SUMS_FILE}",
                           "download or copy the file again; do not install it")
    if candidate.kind == "wheel":
        _verify_wheel(candidate)
    else:
        _verify_bundle_file(candidate.path, candidate.path)


def _verify_wheel(candidate: Candidate) -> None:
    from wheel.wheelfile import WheelError, WheelFile

    path = candidate.path
    module = module_name(candidate.target)
    try:
        with WheelFile(path) as wheel:
            infos = wheel.infolist()
            for info in infos:
                _check_member(path, info, module, wheel.dist_info_path)
            contents = {info.filename: wheel.read(info.filename) for info in infos if not info.is_dir()}
    except WheelError as exc:  # a member that does not match RECORD, or no RECORD
        raise PackageError(f"{path}: {exc}", "the wheel is damaged or was altered; do not install it") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise PackageError(f"{path}: not a readable wheel ({exc})", "download or copy it again") from None
    manifest = Manifest.from_json(contents[f"{module}/{MANIFEST}"].decode("utf-8", "replace"), str(path))
    for name, entry in manifest.files.items():
        data = contents.get(f"{module}/{name}")
        if data is None:
            raise PackageError(f"{path}: {name}, listed in its manifest, is missing", "rebuild it with `kdb package`")
        if hashlib.sha256(data).hexdigest() != entry.get("sha256") or len(data) != entry.get("size"):
            raise PackageError(f"{path}: {name} does not match the SHA-256 in its manifest",
                               "the package was altered; rebuild it with `kdb package`")
        if name.endswith(".kdb"):
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / name
                copy.write_bytes(data)
                _verify_bundle_file(copy, f"{path}:{name}")


def _check_member(path: Path, info: zipfile.ZipInfo, module: str, dist_info: str) -> None:
    """Refuse a member that could land outside the package's folders, or that is not a plain file."""
    name = info.filename
    parts = PurePosixPath(name).parts
    mode = info.external_attr >> 16
    why = ("an absolute path" if name.startswith("/") or "\\" in name or (parts and ":" in parts[0]) else
           "a '..' component" if ".." in parts else
           "a link" if stat.S_ISLNK(mode) else
           "outside its package folder" if not parts or parts[0] not in (module, dist_info) else "")
    if why:
        raise PackageError(f"{path}: member {name!r} is {why}", "the wheel is unsafe; do not install it")


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
    find_db = candidate.path.with_name(candidate.path.name.removesuffix(".kdb") + SYSTEM_SUFFIX)
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
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
               "--disable-pip-version-check", "--quiet", str(candidate.path)]
    try:
        run = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise PackageError(f"cannot run pip ({exc})", "install pip into this environment") from None
    if run.returncode != 0:
        tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
        if "No module named pip" in tail:
            raise PackageError(f"pip is not available in {sys.prefix}",
                               "run `python -m ensurepip`, or give bare bundles instead of wheels")
        raise PackageError(f"pip could not install {candidate.path.name}: {tail}",
                           "see pip's message; the environment is as it was before")
    return Installed(candidate, "pip", (candidate.path.name,))
