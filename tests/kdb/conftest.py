"""Fixtures for bundle tests: blobs that compress like kernel binaries, and bundle factories."""

from __future__ import annotations

import bz2
import hashlib
import random
import sqlite3
from pathlib import Path

import pytest

from kdbkit.kdb import Target, write_bundle


def fake_binary(seed: int, size: int = 6000) -> bytes:
    """A blob shaped like a code object: a shared header, a symbol table, varied 'code'."""
    rng = random.Random(seed)
    header = b"\x7fELF\x02\x01\x01" + b"\x00" * 57
    symbols = b"".join(f"_kernel_{seed % 7}_{i}\x00".encode() for i in range(20))
    opcodes = [rng.randbytes(8) for _ in range(24)]  # a small instruction vocabulary
    code = b"".join(rng.choice(opcodes) for _ in range(size // 8))
    return header + symbols + code


@pytest.fixture
def entries():
    return [(f"kernel{i % 5}.cl.o", f"-DTILE={i} -mcpu=sm_90", fake_binary(i)) for i in range(40)]


@pytest.fixture
def target():
    return Target.parse("sm_90_132")


@pytest.fixture
def bundle_path(tmp_path: Path, entries, target) -> Path:
    return write_bundle(tmp_path / "sm_90_132.kdb", target, entries, compiler="nvrtc 13.0", binary_format="cubin")


def write_miopen_file(path: Path, entries) -> Path:
    """A file as MIOpen writes it: kern_db only, bzip2 blobs (raw if not smaller), md5 hashes."""
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE kern_db (id INTEGER PRIMARY KEY, kernel_name TEXT NOT NULL, kernel_args TEXT NOT NULL, "
        "kernel_blob BLOB NOT NULL, kernel_hash TEXT NOT NULL, uncompressed_size INT NOT NULL);"
        "CREATE UNIQUE INDEX idx_kern_db ON kern_db(kernel_name, kernel_args);")
    for name, args, data in entries:
        packed = bz2.compress(data, 9)
        blob, size = (packed, len(data)) if len(packed) < len(data) else (data, 0)
        conn.execute("INSERT INTO kern_db(kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
                     "VALUES (?, ?, ?, ?, ?)", (name, args, blob, hashlib.md5(data).hexdigest(), size))
    conn.commit()
    conn.close()
    return path
