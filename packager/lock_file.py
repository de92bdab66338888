"""``kdbkit.lock``: what it holds, written by a small deterministic TOML writer, read with ``tomllib``.

A lock names every installed kernel package; the same packages give the same bytes (packages
sorted by name, every table's keys sorted, no timestamp, no path, no host name). Format 1::

    # kdbkit.lock: the kernel packages of an environment, written by `kdb lock`. ...
    format = 1

    [[package]]
    name = "kdbkit-kernels-sm_90"                 # the distribution
    version = "0.2.0"
    target = "sm_90"                              # what its bundle (and find-db) serve
    kdbkit = ">=0.2.0,<0.3"                       # the kdbkit versions it works with
    compiler = "nvrtc 13.0"
    wheel-sha256 = "<64 hex digits>"              # the wheel it was installed from

    [package.files]                               # every bundle and find-db installed
    "sm_90.kdb" = "<sha256>"

    [package.sources]                             # kernel file -> digest it was built from
    "softmax.c" = "<sha256>"

A reader refuses a lock of another format with the fix (a newer one: upgrade kdbkit), and any
lock that is not this shape with the file, the package and the field that is wrong.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from kdbkit.kdb import Target
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.find_db import SYSTEM_SUFFIX
from kdbkit.packager.errors import LockError
from kdbkit.packager.wheel import PACKAGE_PREFIX

LOCK_FORMAT = 1
DEFAULT_LOCK = "kdbkit.lock"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_REWRITE = "write it again with `kdb lock` in the environment to reproduce"
_HEADER = ("# kdbkit.lock: the kernel packages of an environment, written by `kdb lock` (do not edit).\n"
           "# Check an environment: kdb doctor --locked kdbkit.lock\n"
           "# Reproduce it:         kdb install --locked kdbkit.lock --from DIR\n")


@dataclass(frozen=True)
class LockedPackage:
    """One installed kernel package as the lock records it."""

    name: str
    version: str
    target: str
    kdbkit: str  # a PEP 440 specifier
    compiler: str
    wheel_sha256: str
    files: dict[str, str]  # bundle or find-db file -> SHA-256 (hex)
    sources: dict[str, str]  # kernel file -> digest of the source it was built from

    @property
    def label(self) -> str:
        """``kdbkit-kernels-sm_90 0.2.0``: how every message names it."""
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class Lock:
    packages: tuple[LockedPackage, ...]  # sorted by name


def lock_text(lock: Lock) -> str:
    """The lock as TOML: the same lock, the same bytes."""
    lines = [_HEADER, f"format = {LOCK_FORMAT}\n"]
    for p in sorted(lock.packages, key=lambda p: p.name):
        lines.append("\n[[package]]\n")
        for key, value in (("name", p.name), ("version", p.version), ("target", p.target), ("kdbkit", p.kdbkit),
                           ("compiler", p.compiler), ("wheel-sha256", p.wheel_sha256)):
            lines.append(f"{key} = {_string(value)}\n")
        for table, mapping in (("files", p.files), ("sources", p.sources)):
            lines.append(f"\n[package.{table}]\n")
            lines += [f"{_key(k)} = {_string(v)}\n" for k, v in sorted(mapping.items())]
    return "".join(lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(value: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def write_lock(lock: Lock, path: Path) -> Path:
    """Write ``lock`` to ``path`` (replaced whole: a reader never sees half a lock)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(lock_text(lock).encode("utf-8"))
    tmp.replace(path)
    return path


def read_lock(path: Path) -> Lock:
    """The lock at ``path``.

    Raises:
        LockError: the file is missing, unreadable, not TOML, of another format, or not a lock's
            shape; the message names the file (and the package and field) and the fix.
    """
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise LockError(f"no lock file {path}", "write one with `kdb lock` in the environment to reproduce, "
                        "or give its path") from None
    except IsADirectoryError:
        raise LockError(f"{path} is a folder, not a lock file", "give the path of the kdbkit.lock file") from None
    except OSError as exc:
        raise LockError(f"cannot read the lock file {path} ({exc.strerror or exc})",
                        "give a lock file this user can read") from None
    except UnicodeDecodeError as exc:
        raise LockError(f"{path} is not a lock file (not UTF-8 text: {exc.reason})", _REWRITE) from None
    except tomllib.TOMLDecodeError as exc:
        raise LockError(f"{path} is not a lock file (not TOML: {exc})", _REWRITE) from None
    fmt = data.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise LockError(f"{path} is not a kdbkit lock (no `format = {LOCK_FORMAT}` line)", _REWRITE)
    if fmt > LOCK_FORMAT:
        raise LockError(f"{path} is lock format {fmt}, newer than this kdbkit reads ({LOCK_FORMAT})",
                        "upgrade kdbkit to the release that wrote it, or write the lock again with this one's "
                        "`kdb lock`")
    if fmt != LOCK_FORMAT:
        raise LockError(f"{path} is lock format {fmt}; this kdbkit reads format {LOCK_FORMAT}", _REWRITE)
    unknown = sorted(set(data) - {"format", "package"})
    if unknown:
        raise LockError(f"{path}: unknown field {unknown[0]!r} at the top", _REWRITE)
    raw = data.get("package", [])
    if not isinstance(raw, list):
        raise LockError(f"{path}: `package` is not a list of [[package]] tables", _REWRITE)
    packages = [_package(path, i, p) for i, p in enumerate(raw, 1)]
    names = [p.name for p in packages]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LockError(f"{path}: package {twice[0]} is locked twice", _REWRITE)
    return Lock(tuple(sorted(packages, key=lambda p: p.name)))


_FIELDS = ("name", "version", "target", "kdbkit", "compiler", "wheel-sha256", "files", "sources")


def _package(path: Path, index: int, raw) -> LockedPackage:
    where = f"{path}: package {index}"
    if not isinstance(raw, dict):
        raise LockError(f"{where} is not a table", _REWRITE)
    if isinstance(raw.get("name"), str):
        where += f" ({raw['name']})"
    for key in _FIELDS:
        if key not in raw:
            raise LockError(f"{where} has no {key!r}", _REWRITE)
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise LockError(f"{where}: unknown field {unknown[0]!r}", _REWRITE)
    for key in _FIELDS[:6]:
        if not isinstance(raw[key], str) or not raw[key]:
            raise LockError(f"{where}: {key!r} is not a string", _REWRITE)
    for key in ("files", "sources"):
        if not isinstance(raw[key], dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in raw[key].items()):
            raise LockError(f"{where}: {key!r} is not a table of strings", _REWRITE)
    if not raw["name"].startswith(PACKAGE_PREFIX):
        raise LockError(f"{where}: {raw['name']!r} is not a kernel package ({PACKAGE_PREFIX}...)", _REWRITE)
    try:
        Target.parse(raw["target"])
    except KdbError as exc:
        raise LockError(f"{where}: target {raw['target']!r} ({exc.problem})", _REWRITE) from None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(raw["kdbkit"])
    except InvalidSpecifier:
        raise LockError(f"{where}: kdbkit {raw['kdbkit']!r} is not a version range", _REWRITE) from None
    if not _HEX64.fullmatch(raw["wheel-sha256"]):
        raise LockError(f"{where}: wheel-sha256 is not 64 lower-case hex digits", _REWRITE)
    for name, digest in raw["files"].items():
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith((".kdb", SYSTEM_SUFFIX)):
            raise LockError(f"{where}: {name!r} in files is not a bundle or find-db name", _REWRITE)
        if not _HEX64.fullmatch(digest):
            raise LockError(f"{where}: the sha256 of {name} is not 64 lower-case hex digits", _REWRITE)
    if not any(name.endswith(".kdb") for name in raw["files"]):
        raise LockError(f"{where}: files names no bundle (.kdb)", _REWRITE)
    return LockedPackage(raw["name"], raw["version"], raw["target"], raw["kdbkit"], raw["compiler"],
                         raw["wheel-sha256"], dict(raw["files"]), dict(raw["sources"]))
