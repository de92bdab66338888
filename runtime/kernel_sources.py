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

import hashlib
import re
from pathlib import Path, PurePosixPath

from kdb.errors import KdbError

# A marker file that only kdbkit's kernels folder has; it tells ours from other "kernels" dirs.
_MARKER = "kdb_compat.h"
_DIGEST_SCHEMA = b"kdb-source-digest/1"
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


class KernelSourceError(KdbError, FileNotFoundError):
    """A kernel source, or a file it includes, cannot be found or read."""


def kernels_dir() -> Path:
    """Return the folder holding the kernel sources.

    Returns:
        ``runtime/_kernels`` inside an installed wheel, else ``<checkout>/kernels``.

    Raises:
        KernelSourceError: neither exists (a broken install).
    """
    runtime_dir = Path(__file__).resolve().parent
    candidates = (runtime_dir / "_kernels", runtime_dir.parent / "kernels")
    for candidate in candidates:
        if (candidate / _MARKER).is_file():
            return candidate
    raise KernelSourceError(
        f"kdbkit's kernel sources are missing: looked for {_MARKER} in {', '.join(map(str, candidates))}; "
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
    return sorted(p.name for p in kernels_dir().glob("*.c"))


def quoted_includes(text: str) -> list[str]:
    """The file names a source includes with quotes, in order of appearance."""
    return _QUOTED_INCLUDE.findall(text)


def source_digest(name: str) -> str:
    """SHA-256 (hex) over kernel source ``name`` and every file it includes with quotes.

    Each file is hashed once, in depth-first include order, as length-prefixed
    ``(relative path, bytes)`` fields after a schema tag, so moving text between files or
    renaming a header changes the digest.

    Raises:
        KernelSourceError: the source or one of its (transitive) quoted includes is missing;
            the message names the missing file and the file that includes it.
    """
    root = kernels_dir()
    h = hashlib.sha256()
    h.update(_DIGEST_SCHEMA)
    seen: set[Path] = set()

    def visit(path: Path) -> None:
        if path in seen:
            return
        seen.add(path)
        data = path.read_bytes()
        label = path.relative_to(root).as_posix().encode()
        for field in (label, data):
            h.update(len(field).to_bytes(8, "little"))
            h.update(field)
        rel_name = path.relative_to(root).as_posix()
        for inc in quoted_includes(data.decode("utf-8", "replace")):
            visit(_resolve(inc, root, base=path.parent, included_from=rel_name))

    visit(_resolve(name, root))
    return h.hexdigest()
