"""A kernel wheel read as untrusted data: what it may hold, and how much of it is read.

A kernel package is data: its bundle, its find-db, ``manifest.json`` (and, signed, exactly one
``manifest.json.sig`` in the form ``kdb package --sign`` writes) and the members
:func:`~kdbkit.packager.wheel.generated_members` makes (``__init__.py``, ``METADATA``,
``entry_points.txt``), ``WHEEL`` and ``RECORD``. Anything else (a console script, another entry
point, a ``.pth`` file, a ``.data`` folder, a module of its own, one byte changed in a generated
file) is refused, because pip would install it and Python could run it.

Sizes are checked before anything is read: every member's declared size against a cap (data
files against :data:`MAX_DATA_BYTES`, every other member against :data:`MAX_TEXT_BYTES`), the
sum against :data:`MAX_TOTAL_BYTES`, and each large member's compression ratio against
:data:`MAX_RATIO` (a zip bomb's ratio is in the hundreds; a bundle's binaries are already
zstd-compressed). Data members are then stream-copied with a running byte count, so a member
that lies about its size is still stopped at its cap, and no member is held whole in memory.
"""

from __future__ import annotations

import hashlib
import re
import stat
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO

from kdbkit.kdb.find_db import SYSTEM_SUFFIX
from kdbkit.kdb.signing import read_detached_signature
from kdbkit.packager.errors import PackageError

MAX_DATA_BYTES = 4 << 30  # a bundle or find-db; larger than any catalogue's bundle seen so far
MAX_TEXT_BYTES = 1 << 20  # the manifest, the generated module, the dist-info files
MAX_TOTAL_BYTES = 8 << 30
MAX_RATIO = 50  # uncompressed / compressed, for members above RATIO_FLOOR
RATIO_FLOOR = 1 << 20  # small members may compress well (empty SQLite pages) and cost nothing
_CHUNK = 1 << 20
_GENERATOR = re.compile(r"Generator: kdbkit [0-9A-Za-z.+!_-]+")
_UNSAFE = "the wheel is unsafe; do not install it"


def check_sizes(path: Path, infos: list[zipfile.ZipInfo], data_names: set[str] | None = None) -> None:
    """Refuse ``path`` when a member's declared size or ratio is over its cap, from the central
    directory alone (nothing is decompressed here).

    Args:
        data_names: the members allowed :data:`MAX_DATA_BYTES` (default: every ``.kdb`` and
            ``.fdb`` member); every other member is allowed :data:`MAX_TEXT_BYTES`.

    Raises:
        PackageError: naming the member and its declared size.
    """
    total = 0
    for info in infos:
        is_data = (info.filename in data_names) if data_names is not None else \
            info.filename.endswith((".kdb", SYSTEM_SUFFIX))
        cap = MAX_DATA_BYTES if is_data else MAX_TEXT_BYTES
        if info.file_size > cap:
            raise PackageError(f"{path}: member {info.filename!r} declares {info.file_size} bytes, over the "
                               f"{cap}-byte cap for it", _UNSAFE)
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise PackageError(f"{path}: member {info.filename!r} expands {info.file_size} bytes from "
                               f"{info.compress_size} (over {MAX_RATIO}:1, a zip bomb)", _UNSAFE)
        total += info.file_size
    if total > MAX_TOTAL_BYTES:
        raise PackageError(f"{path}: its members declare {total} bytes in all, over the {MAX_TOTAL_BYTES}-byte cap",
                           _UNSAFE)


def check_member_path(path: Path, info: zipfile.ZipInfo, module: str, dist_info: str) -> None:
    """Refuse a member that could land outside the package's folders, or that is not a plain file."""
    name = info.filename
    parts = PurePosixPath(name).parts
    mode = info.external_attr >> 16
    why = ("an absolute path" if name.startswith("/") or "\\" in name or (parts and ":" in parts[0]) else
           "a '..' component" if ".." in parts else
           "a link" if stat.S_ISLNK(mode) else
           "outside its package folder" if not parts or parts[0] not in (module, dist_info) else "")
    if why:
        raise PackageError(f"{path}: member {name!r} is {why}", _UNSAFE)


def check_members(path: Path, names: list[str], allowed: set[str]) -> None:
    """Refuse a member that is not one of ``allowed`` (the data files, the manifest, the generated
    members, ``WHEEL`` and ``RECORD``), or a wheel that lacks one of them."""
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})[0]
        raise PackageError(f"{path}: member {twice!r} is there twice", _UNSAFE)
    for name in names:
        if name not in allowed:
            raise PackageError(f"{path}: member {name!r} is not part of a kernel package (one holds only its bundle, "
                               "find-db, manifest and generated module: no code, no scripts, no other entry point)",
                               _UNSAFE)
    missing = sorted(allowed - set(names))
    if missing:
        raise PackageError(f"{path}: member {missing[0]!r} is missing", "rebuild the package with `kdb package`")


def check_generated(path: Path, name: str, data: bytes, expected: bytes | None) -> None:
    """Refuse a generated member that differs from what ``kdb package`` writes (``expected``;
    None for ``WHEEL``, whose generator line names the packaging kdbkit's version)."""
    if expected is None:
        lines = data.decode("utf-8", "replace").splitlines()
        same = len(lines) == 4 and lines[0] == "Wheel-Version: 1.0" and bool(_GENERATOR.fullmatch(lines[1])) \
            and lines[2:] == ["Root-Is-Purelib: true", "Tag: py3-none-any"]
    else:
        same = data == expected
    if not same:
        raise PackageError(f"{path}: member {name!r} is not the one `kdb package` writes (a kernel package runs "
                           "no code of its own)", _UNSAFE)


def check_signature(path: Path, name: str, data: bytes) -> tuple[str, bytes]:
    """The key id and signature of a ``manifest.json.sig`` member; refuse one that is not exactly
    what ``kdb package --sign`` writes (a JSON object of its format, key id and base64 signature,
    in one fixed form)."""
    parsed = read_detached_signature(data)
    if parsed is None:
        raise PackageError(f"{path}: member {name!r} is not a signature `kdb package --sign` writes", _UNSAFE)
    return parsed


def read_text_member(archive: zipfile.ZipFile, path: Path, info: zipfile.ZipInfo) -> bytes:
    """A small member's bytes, read no further than :data:`MAX_TEXT_BYTES`."""
    with archive.open(info) as member:
        data = member.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise PackageError(f"{path}: member {info.filename!r} is over the {MAX_TEXT_BYTES}-byte cap", _UNSAFE)
        member.read(1)  # to its end, so that the wheel's RECORD hash is checked
    return data


def copy_data_member(archive: zipfile.ZipFile, path: Path, info: zipfile.ZipInfo, dest: IO[bytes]) -> tuple[str, int]:
    """Stream a data member into ``dest``; return its SHA-256 and size.

    Raises:
        PackageError: the member yields more than it declared or than :data:`MAX_DATA_BYTES`.
    """
    cap = min(info.file_size, MAX_DATA_BYTES)
    digest, count = hashlib.sha256(), 0
    with archive.open(info) as member:
        for block in iter(lambda: member.read(_CHUNK), b""):
            count += len(block)
            if count > cap:
                raise PackageError(f"{path}: member {info.filename!r} yields more than the {cap} bytes it declares",
                                   _UNSAFE)
            digest.update(block)
            dest.write(block)
    return digest.hexdigest(), count
