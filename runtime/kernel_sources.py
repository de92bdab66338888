"""Where kernel sources live, and the digest that ties a binary to the exact source it came from.

``kernels/`` is data, not an import package (PyPI's name ``kernels`` is taken). In a checkout
it sits next to ``runtime/``; in an installed wheel, pyproject force-includes it as
``runtime/_kernels``. Both are looked for, the wheel's first.

The digest covers the source text and, recursively, every file it includes with quotes
(``#include "kdb_compat.h"``), so that editing the compatibility header changes the cache key
of every kernel that uses it. Angle-bracket includes are compiler headers: the compiler
identity, not this digest, covers them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path, PurePosixPath

from kdbkit.kdb.errors import KdbError

# A marker file that only kdbkit's kernels folder has; it tells ours from other "kernels" dirs.
_MARKER = "kdb_compat.h"
_DIGEST_SCHEMA = b"kdb-source-digest/2"
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


class KernelSourceError(KdbError, FileNotFoundError):
    """A kernel source, or a file it includes, cannot be found or read."""


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
    # sandboxes where system calls are slow, and ../kernels is found the same way either way.
    candidate = Path(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) / "kernels"
    if (candidate / _MARKER).is_file():
        return candidate
    raise KernelSourceError(
        f"kdbkit's kernel sources are missing: no {_MARKER} in {candidate}; "
        "reinstall kdbkit (`pip install --force-reinstall kdbkit`) or run from a full checkout"
    )


def _resolve(name: str, root: Path, *, base: Path | None = None, included_from: str | None = None) -> Path:
    """Find ``name`` as the preprocessor would: next to the including file, then in ``root``."""
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise KernelSourceError(f"kernel source name {name!r} must be a plain path inside {root}")
    for folder in ([base] if base is not None else []) + [root]:
        candidate = folder / rel
        if candidate.is_file():
            return candidate
    where = f" (included from {included_from})" if included_from else ""
    raise KernelSourceError(f"kernel source {name!r}{where} not found in {root}")


def read_source(name: str) -> str:
    """Return the text of kernel source ``name``, e.g. ``"activation.c"``.

    Raises:
        KernelSourceError: no such file in :func:`kernels_dir`, or the name leaves it.
    """
    return _resolve(name, kernels_dir()).read_text(encoding="utf-8")


def list_sources() -> list[str]:
    """Names of the kernel sources (``*.c``) in :func:`kernels_dir`, sorted."""
    # scandir, not Path.glob: glob compiles a pattern per call, which costs more than the
    # listing itself in a fresh process (measured here: 150 us against 40 us)
    with os.scandir(kernels_dir()) as entries:
        return sorted(e.name for e in entries if e.name.endswith(".c") and e.is_file())


def source_digests() -> dict[str, str]:
    """:func:`source_digest` of every kernel source in :func:`kernels_dir`, by name.

    A handle takes this snapshot when it is made, so that resolving a program later costs no
    file access for its source. A source that cannot be digested (an include is missing) is
    left out: asking for it later raises, naming the missing file.

    Raises:
        KernelSourceError: there is no kernels folder at all.
    """
    digests = {}
    for name in list_sources():
        try:
            digests[name] = source_digest(name)
        except KernelSourceError:
            continue
    return digests


def quoted_includes(text: str) -> list[str]:
    """The file names a source includes with quotes, in order of appearance."""
    return _QUOTED_INCLUDE.findall(text)


# Per-process cache, one entry per file: its (mtime_ns, size) stamp, the SHA-256 of its
# bytes and the files it includes. A later digest of a kernel then costs one stat per file
# instead of reading and scanning each (the shared header above all); a file whose stamp
# changed is read again, so an edited source always gives a new digest.
_files: dict[str, tuple[tuple[int, int], bytes, tuple[str, ...]]] = {}


def _file_info(path: str) -> tuple[bytes, tuple[str, ...]] | None:
    """(SHA-256 of the file, its quoted includes), or None if there is no such file."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _files.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1], cached[2]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    info = (hashlib.sha256(data).digest(), tuple(quoted_includes(data.decode("utf-8", "replace"))))
    _files[path] = (stamp, *info)
    return info


def source_digest(name: str) -> str:
    """SHA-256 (hex) over kernel source ``name`` and every file it includes with quotes.

    Each file counts once, in depth-first include order, as length-prefixed
    ``(relative path, SHA-256 of its bytes)`` fields after a schema tag, so editing any file,
    moving text between files or renaming a header changes the digest.

    Raises:
        KernelSourceError: the source or one of its (transitive) quoted includes is missing;
            the message names the missing file and the file that includes it.
    """
    root = str(kernels_dir())
    h = hashlib.sha256()
    h.update(_DIGEST_SCHEMA)
    seen: set[str] = set()

    def visit(inc: str, base: str | None, included_from: str | None) -> None:
        rel = PurePosixPath(inc)
        if rel.is_absolute() or ".." in rel.parts:
            raise KernelSourceError(f"kernel source name {inc!r} must be a plain path inside {root}")
        for folder in ((base, root) if base is not None and base != root else (root,)):
            path = os.path.join(folder, inc)
            info = _file_info(path)
            if info is not None:
                break
        else:
            where = f" (included from {included_from})" if included_from else ""
            raise KernelSourceError(f"kernel source {inc!r}{where} not found in {root}")
        if path in seen:
            return
        seen.add(path)
        rel_name = path[len(root) + 1:].replace(os.sep, "/")  # path is root/... by construction
        for field in (rel_name.encode(), info[0]):
            h.update(len(field).to_bytes(8, "little"))
            h.update(field)
        for child in info[1]:
            visit(child, os.path.dirname(path), rel_name)

    visit(name, None, None)
    return h.hexdigest()
