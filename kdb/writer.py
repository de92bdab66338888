"""Write a whole bundle at once: train a dictionary if it pays, then publish atomically.

Builders (the packager, ``kdb db merge``) know every blob up front, so they can afford
zstd level 19 and a dictionary trained over the bundle's own blobs. The dictionary is kept
only when blobs + dictionary come out smaller than blobs alone. The file is written under a
temporary name in the same folder and renamed into place, so a reader never sees half a
bundle and a failed build leaves the old file untouched.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Iterable

from kdb import codec as _codec
from kdb.bundle import Bundle
from kdb.target import Target

DICT_SIZE = 32 * 1024
# Training on every blob of a 100k-entry bundle buys nothing over a sample and costs minutes.
MAX_TRAINING_SAMPLES = 2000
BATCH = 1000  # entries per transaction: bounded memory for bundles of any size
# 16 KiB pages pack several compressed kernels per page; with 4 KiB pages each blob of a
# few kB spills into overflow pages of its own (measured: files 25% smaller, same speed).
PAGE_SIZE = 16384


def choose_dictionary(blobs: list[bytes], level: int = _codec.BUNDLE_LEVEL, dict_size: int = DICT_SIZE) -> bytes | None:
    """Return a trained dictionary if it makes these blobs smaller in total, else None."""
    step = max(1, len(blobs) // MAX_TRAINING_SAMPLES)
    samples = blobs[::step]
    dictionary = _codec.train_dictionary(samples, dict_size=dict_size, level=level)
    if dictionary is None:
        return None
    plain = _codec.Codec("zstd", level=level)
    trained = _codec.Codec("zstd", level=level, dictionary=dictionary)
    # Compare on the training sample: same ratio as the whole at a fraction of the time.
    without = sum(len(plain.encode(b).blob) for b in samples)
    with_dict = sum(len(trained.encode(b).blob) for b in samples) + len(dictionary) * len(samples) / len(blobs)
    return dictionary if with_dict < without else None


def write_bundle(path: str | Path, target: Target, entries: Iterable[tuple[str, str, bytes]], *, compiler: str,
                 binary_format: str, codec: str = "zstd", dictionary: bool | bytes = True,
                 level: int = _codec.BUNDLE_LEVEL) -> Path:
    """Write a complete bundle to ``path`` atomically.

    Args:
        path: destination ``.kdb``; replaced only once the new file is complete.
        target: what the binaries are built for.
        entries: (kernel_name, kernel_args, binary) triples; streamed in batches unless a
            dictionary must be trained over them (``dictionary=True`` reads them all first).
        compiler: compiler identity, e.g. ``nvrtc 13.0``.
        binary_format: ``cubin``, ``hsaco`` or ``ocl-binary``.
        codec: ``zstd`` or ``bzip2`` (MIOpen-compatible output).
        dictionary: True to train one when it pays, False for none, or the bytes of one.
        level: zstd level.

    Returns:
        The path written.
    """
    path = Path(path)
    if dictionary is True:
        entries = list(entries)
        dict_bytes = choose_dictionary([e[2] for e in entries], level) if codec == "zstd" else None
    elif dictionary is False:
        dict_bytes = None
    else:
        dict_bytes = dictionary
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)  # SQLite creates the file itself; mkstemp only reserved a unique name
    try:
        with Bundle.create(tmp, target, compiler=compiler, binary_format=binary_format, codec=codec,
                           dictionary=dict_bytes) as bundle:
            bundle.write_level = level
            it = iter(entries)
            while batch := list(itertools.islice(it, BATCH)):
                bundle.put_many(batch)
            bundle.compact(page_size=PAGE_SIZE)
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp + "-journal"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path
