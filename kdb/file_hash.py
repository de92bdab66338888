"""The SHA-256 of a file, read in blocks: bundles and wheels may be gigabytes.

One function for every place that names a file by its digest: ``SHA256SUMS`` and the installer's
checks, a bundle's build record, a lock file, the runtime's check of a signed package's bundle.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 1 << 20


def sha256_of(path: str | Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()
