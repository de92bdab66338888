"""Where kernel sources are found, and one read of a source from which its digest and text both come.

Kernel sources are data, looked up by name (``activation.c``, ``mylib/softmax.c``) along a
search path: the folders a handle is given, then ``KDB_KERNEL_PATH``, then kdbkit's own
``kernels/`` (beside ``runtime/`` in a checkout; ``kdbkit/kernels`` in a wheel). The first
folder holding the name wins, so a library that ships kernels uses kdbkit's keys, bundles,
caches and chain for them by putting its folder on the path. ``kdb resolve`` shows which
folder a name came from.

The digest covers the source and, recursively, every file it includes with quotes
(``#include "kdb_compat.h"``), each found as the preprocessor would: next to the including
file, then along the search path. It hashes contents and relative names, never folders, so a
bundle built on one machine matches the same sources installed anywhere. Angle-bracket
includes are compiler headers: the compiler's identity covers them.

A compile never re-reads a file: :meth:`KernelSearchPath.read` reads every file once and
returns a :class:`KernelSource` whose digest and compiler text (the includes inlined, with
``#line`` markers) come from those same bytes, so a binary is never stored under the key of
another version of its source.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from kdbkit.runtime import env, startup_memo
from kdbkit.runtime.errors import KernelSourceError

# A marker file that only kdbkit's kernels folder has; it tells ours from other "kernels" dirs.
_MARKER = "kdb_compat.h"
# Version 3: the compiler is given the includes inlined (see KernelSource.text); a change to
# that text must change every key, so the inlining rules are part of this version.
_DIGEST_SCHEMA = b"kdb-source-digest/3"
_INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b[^\n]*$", re.MULTILINE)
_GUARD = re.compile(r"\A(?:\s|//[^\n]*\n|/\*.*?\*/)*#[ \t]*ifndef[ \t]+(\w+)\s*#[ \t]*define[ \t]+\1\b", re.DOTALL)
MAX_INCLUDE_DEPTH = 32


@functools.lru_cache(maxsize=1)
def kernels_dir() -> Path:
    """Return the folder holding kdbkit's own kernel sources (found once per process).

    Returns:
        ``kernels/`` beside ``runtime/``: in a checkout (and an editable install) the
        repository's folder, in an installed wheel ``kdbkit/kernels``.

    Raises:
        KernelSourceError: it is missing (a broken install).
    """
    # abspath, not resolve(): one lstat per path component is a cost on every first call in
    # sandboxes where system calls are slow; os.path, not pathlib: this is on a handle's first
    # steps, where making pathlib's objects costs more than the string functions.
    candidate = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
    if os.path.isfile(os.path.join(candidate, _MARKER)):
        return Path(candidate)
    raise KernelSourceError(
        f"kdbkit's kernel sources are missing: no {_MARKER} in {candidate}",
        "reinstall kdbkit (`pip install --force-reinstall kdbkit`) or run from a full checkout")


@functools.lru_cache(maxsize=1024)
def _name_parts(name: str) -> tuple[str, ...]:
    """The parts of a kernel source name (``/``-separated); refuses names that would leave their folder."""
    # Plain string work, not PurePosixPath: this runs for every name a handle digests.
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts or name.startswith("/") or ".." in parts or "\0" in name:
        raise KernelSourceError(f"kernel source name {name!r} must be a relative path inside a kernel folder",
                                "name it relative to its folder on the kernel search path")
    return parts


# -- one file: its bytes' hash and its quoted includes, remembered by stamp ----------------

# Per-process cache, one entry per path: its stamp (startup_memo.stamp), the SHA-256 of its
# bytes and the files it includes. A later digest then costs one stat per file instead of a
# read and a scan; a file whose stamp changed is read again, so an edit always gives a new
# digest. The startup memo keeps the same entries for the next process.
_files: dict[str, tuple[list[int], bytes, tuple[str, ...]]] = {}


def quoted_includes(text: str) -> list[str]:
    """The file names a source includes with quotes, in order of appearance."""
    return _INCLUDE_LINE.findall(text)


def _file_info(path: str) -> tuple[bytes, tuple[str, ...]] | None:
    """(SHA-256 of the file, its quoted includes), or None if there is no such file."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    stamp = startup_memo.stamp(st)
    cached = _files.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    memo = startup_memo.memo()
    remembered = memo.section("sources").get(path)
    if isinstance(remembered, list) and len(remembered) == 3 and remembered[0] == stamp:
        try:
            info = (bytes.fromhex(remembered[1]), tuple(str(name) for name in remembered[2]))
        except (TypeError, ValueError):
            info = None  # a damaged entry: read the file
        if info is not None and len(info[0]) == 32:
            _files[path] = (stamp, *info)
            return info
    data = _read_bytes(path)
    if data is None:
        return None
    info = (hashlib.sha256(data).digest(), tuple(quoted_includes(data.decode("utf-8", "replace"))))
    _files[path] = (stamp, *info)
    memo.put("sources", path, [stamp, info[0].hex(), list(info[1])])
    return info


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        raise KernelSourceError(f"cannot read kernel source {path}: {exc.strerror or exc}",
                                "check the file's permissions") from exc


@dataclass(frozen=True)
class SourceFile:
    """One file of a kernel source: where it was found, its bytes, and where each include led."""

    rel_name: str  # relative to the search-path folder that holds it, "/"-separated
    path: str
    data: bytes
    includes: tuple[tuple[str, str], ...] = ()  # (name in the #include, path it resolved to)


@dataclass(frozen=True)
class KernelSource:
    """One read of a kernel source and every file it includes: what a compiler is given.

    Attributes:
        name: the name asked for, e.g. ``activation.c``.
        folder: the search-path folder it was found in.
        files: the source first, then every included file in depth-first order, each once.
        digest: SHA-256 (hex) over the files' relative names and bytes (see :func:`_digest`).
    """

    name: str
    folder: Path
    files: tuple[SourceFile, ...]
    digest: str

    def text(self) -> str:
        """The source with every quoted include inlined, as one translation unit.

        Built from the bytes read, never from the disk again. Each inlined file is framed by
        ``#line`` markers, so the compiler's messages name the real file and line. A header
        with ``#pragma once`` or a classic include guard is inlined at its first inclusion
        only (as a preprocessor would see it); others at each.
        """
        return _inline(self.files[0], {f.path: f for f in self.files}, [], set())


def _inline(file: SourceFile, by_path: dict[str, SourceFile], stack: list[str], done: set[str]) -> str:
    if len(stack) >= MAX_INCLUDE_DEPTH:
        raise KernelSourceError(f"includes nested more than {MAX_INCLUDE_DEPTH} deep ({' -> '.join(stack)})",
                                "an include cycle needs #pragma once or an include guard")
    stack = [*stack, file.rel_name]
    text = file.data.decode("utf-8", "replace")
    if _PRAGMA_ONCE.search(text) or _GUARD.match(text):
        done.add(file.path)
    # `#pragma once` outside a real file draws a warning; an empty line keeps the numbering.
    text = _PRAGMA_ONCE.sub("", text)
    resolved = dict(file.includes)

    def include(m: re.Match) -> str:
        child = by_path[resolved[m.group(1)]]
        resume = f'#line {text.count(chr(10), 0, m.end()) + 2} "{file.rel_name}"'
        if child.path in done:
            return resume
        return f'#line 1 "{child.rel_name}"\n{_inline(child, by_path, stack, done)}\n{resume}'

    return _INCLUDE_LINE.sub(include, text)


def _locate(inc: str, includer: tuple[str, str], roots: Sequence[str], included_from: str, read):
    """Find ``#include "inc"`` as the preprocessor would: beside the includer, then along the path.

    Args:
        includer: (search folder, folder) of the including file.
        roots: the search path's folders, in order.
        read: gives a file's (SHA-256, includes[, bytes]), or None where there is none; the
            one system call per candidate both finds and reads it.

    Returns:
        (search folder that holds it, its name relative to that folder, its path, what ``read`` gave).
    """
    parts = _name_parts(inc)
    root, base = includer
    for folder, where in ((root, base), *((r, r) for r in roots)):
        path = os.path.join(where, *parts)
        info = read(path)
        if info is not None:
            return folder, path[len(folder) + 1:].replace(os.sep, "/"), path, info
    raise KernelSourceError(f"kernel source {inc!r} (included from {included_from}) not found",
                            "put it beside the file that includes it or on the kernel search path (KDB_KERNEL_PATH)")


class KernelSearchPath:
    """The folders kernel sources are looked up in, first match wins.

    Args:
        folders: folders to search before ``KDB_KERNEL_PATH`` and kdbkit's own ``kernels/``
            (a library's kernels, say).
    """

    def __init__(self, folders: Iterable[str | Path] = ()):
        ordered = [os.path.expanduser(f) for f in folders]
        ordered += env.get_pathlist("KDB_KERNEL_PATH")
        ordered.append(kernels_dir())
        # Strings inside (os.path is cheaper than pathlib on a handle's first steps); Paths outside.
        self._roots: list[str] = list(dict.fromkeys(os.path.abspath(f) for f in ordered))

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders searched, first match wins."""
        return tuple(map(Path, self._roots))

    def __repr__(self) -> str:
        return f"KernelSearchPath({self._roots})"

    def find(self, name: str) -> Path:
        """The search-path folder that holds kernel source ``name``.

        Raises:
            KernelSourceError: no folder holds it, or the name leaves its folder.
        """
        parts = _name_parts(name)
        for root in self._roots:
            if os.path.isfile(os.path.join(root, *parts)):
                return Path(root)
        raise self._not_found(name)

    def _not_found(self, name: str) -> KernelSourceError:
        return KernelSourceError(
            f"no kernel source {name!r} in {', '.join(self._roots)}",
            "check the name, or add its folder to KDB_KERNEL_PATH (or the handle's kernel_path)")

    def names(self) -> list[str]:
        """The ``*.c`` sources at the top of every folder, each name once (first folder wins)."""
        names: set[str] = set()
        for folder in self._roots:
            # scandir, not Path.glob: glob compiles a pattern per call, which in a fresh process
            # costs more than the listing itself
            try:
                with os.scandir(folder) as entries:
                    names.update(e.name for e in entries if e.name.endswith(".c") and e.is_file())
            except OSError:
                continue  # a folder on KDB_KERNEL_PATH that does not exist holds nothing
        return sorted(names)

    def _walk(self, name: str, read) -> tuple[Path, list[tuple[str, str, tuple, tuple]]]:
        """Visit ``name`` and its includes depth-first, each path once.

        ``read(path)`` gives (SHA-256, include names[, bytes]) or None. Returns the folder of
        ``name`` and, per file, (relative name, path, what ``read`` gave, where each include led).
        """
        parts = _name_parts(name)
        for root in self._roots:
            path = os.path.join(root, *parts)
            info = read(path)
            if info is not None:
                break
        else:
            raise self._not_found(name)
        visited: list[tuple[str, str, tuple, tuple]] = []
        seen: set[str] = set()

        def visit(root: str, rel: str, path: str, info: tuple) -> None:
            if path in seen:
                return
            seen.add(path)
            children = [(inc, _locate(inc, (root, os.path.dirname(path)), self._roots, rel, read)) for inc in info[1]]
            visited.append((rel, path, info, tuple((inc, child[2]) for inc, child in children)))
            for _, child in children:
                visit(*child)

        visit(root, name, path, info)
        return Path(root), visited

    def digest(self, name: str) -> str:
        """SHA-256 (hex) of source ``name`` and every file it includes (see :func:`_digest`).

        Files unchanged since the process last read them (same mtime and size) are not read again.

        Raises:
            KernelSourceError: the source or one of its quoted includes is missing; the
                message names the missing file and the file that includes it.
        """
        _, visited = self._walk(name, _file_info)
        return _digest((rel, info[0]) for rel, _, info, _ in visited)

    def digest_each(self, names: Iterable[str]) -> dict[str, str | KernelSourceError]:
        """:meth:`digest` of every name, or the error that name raised, in one pass that
        stats each file once however many of the names include it (a bundle's sources all
        include the same headers: 66 stats for 13 sources became 21)."""
        seen: dict[str, tuple[bytes, tuple[str, ...]] | None] = {}

        def once(path: str):
            info = seen.get(path, seen)
            if info is seen:
                info = seen[path] = _file_info(path)
            return info

        out: dict[str, str | KernelSourceError] = {}
        for name in names:
            try:
                _, visited = self._walk(name, once)
                out[name] = _digest((rel, info[0]) for rel, _, info, _ in visited)
            except KernelSourceError as exc:
                out[name] = exc
        return out

    def read(self, name: str) -> KernelSource:
        """Read source ``name`` and its includes once, for a compile: digest and text agree.

        Raises:
            KernelSourceError: as :meth:`digest`.
        """
        def fresh(path: str):
            data = _read_bytes(path)
            if data is None:
                return None
            return hashlib.sha256(data).digest(), tuple(quoted_includes(data.decode("utf-8", "replace"))), data

        folder, visited = self._walk(name, fresh)
        files = tuple(SourceFile(rel, path, info[2], includes) for rel, path, info, includes in visited)
        return KernelSource(name, folder, files, _digest((rel, info[0]) for rel, _, info, _ in visited))


def _digest(entries: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over a schema tag, then per file its relative name and the SHA-256 of its bytes,
    each length-prefixed, in depth-first include order: editing any file, moving text between
    files or renaming a header changes it; the folders the files live in do not."""
    h = hashlib.sha256(_DIGEST_SCHEMA)
    for rel, sha in entries:
        for field in (rel.encode(), sha):
            h.update(len(field).to_bytes(8, "little"))
            h.update(field)
    return h.hexdigest()


# -- the default search path (KDB_KERNEL_PATH, then kdbkit's kernels) ---------------------

def default_path() -> KernelSearchPath:
    """The search path of a handle made without ``kernel_path``."""
    return KernelSearchPath()


def read_source(name: str) -> str:
    """The text of kernel source ``name`` on the default path, includes left as they are."""
    folder = default_path().find(name)
    data = _read_bytes(os.path.join(folder, *_name_parts(name)))
    return (data or b"").decode("utf-8")


def list_sources() -> list[str]:
    """Names of the ``*.c`` sources on the default path, sorted."""
    return default_path().names()


def source_digest(name: str) -> str:
    """:meth:`KernelSearchPath.digest` on the default path."""
    return default_path().digest(name)
