"""Write a whole bundle at once: train a dictionary if it pays, then publish atomically.

Builders (the packager, ``kdb db merge``) know every blob up front, so they can afford
zstd level 19 and a dictionary trained over the bundle's own blobs. The dictionary is kept
only when blobs + dictionary come out smaller than blobs alone. The file is written under a
temporary name in the same folder and renamed into place, so a reader never sees half a
bundle and a failed build leaves the old file untouched.

A writer that is killed leaves its temporary file (and SQLite's ``-journal`` beside it). The
temporary name carries the writer's host and pid (``.<name>.<host>-<pid>.<random>.tmp``), so the
next write into the folder removes those whose writer is provably gone: a pid of this host
that no longer runs, or, for a name without one (another host's, or an older kdbkit's), a
file untouched for :data:`STALE_TEMP_S`. A live writer's file is never touched.

The same entries give the same file, byte for byte: rows are inserted in the order given (the
builder sorts them by key) into a new file, which VACUUM then rebuilds with a fixed page size
(no free pages, no trace of the batches); the dictionary is trained on a seeded sample with
fixed parameters; no path or host name is stored; the one clock reading is ``created``, which
honours ``SOURCE_DATE_EPOCH`` (:mod:`kdbkit.kdb.reproducible`). What else the bytes depend on:
the SQLite library (its version number is in the file's header) and zstd's (the ``zstandard``
package's), so a rebuild meant to match uses the same ones.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

from kdbkit.kdb import codec as _codec
from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.reproducible import created_stamp
from kdbkit.kdb.target import Target

DICT_SIZE = 32 * 1024
# Training on every blob of a 100k-entry bundle buys nothing over a sample and costs minutes.
MAX_TRAINING_SAMPLES = 2000
BATCH = 1000  # entries per transaction: bounded memory for bundles of any size
# 16 KiB pages pack several compressed kernels per page, where 4 KiB pages leave each blob
# of a few kB its own overflow pages (measured on real cubins: files 6% smaller, lookups as
# fast; 64 KiB pages would save 15% and are worth measuring for open time).
PAGE_SIZE = 16384
STALE_TEMP_S = 24 * 3600  # a temporary file of a writer we cannot ask about is left this long


def training_sample(blobs: Sequence[bytes], n: int = MAX_TRAINING_SAMPLES) -> list[bytes]:
    """At most ``n`` blobs drawn at random (seeded: the same input gives the same bundle).

    Random rather than every k-th: builders write entries in repeating orders (kernel by
    kernel, shape by shape), and a stride can line up with them and miss whole families.
    """
    if len(blobs) <= n:
        return list(blobs)
    return [blobs[i] for i in sorted(random.Random(0).sample(range(len(blobs)), n))]


def choose_dictionary(blobs: Sequence[bytes], level: int = _codec.BUNDLE_LEVEL, dict_size: int = DICT_SIZE,
                      total: int | None = None) -> bytes | None:
    """Return a trained dictionary if it makes the bundle smaller in total, else None.

    Args:
        blobs: the blobs, or a sample of them (see :func:`training_sample`).
        level: zstd level the bundle is written with.
        dict_size: the dictionary's size in bytes.
        total: how many blobs the bundle will hold, when ``blobs`` is a sample.
    """
    samples = training_sample(blobs)
    dictionary = _codec.train_dictionary(samples, dict_size=dict_size, level=level)
    if dictionary is None:
        return None
    plain = _codec.Codec("zstd", level=level)
    trained = _codec.Codec("zstd", level=level, dictionary=dictionary)
    # Judge on the sample: the same ratio as the whole at a fraction of the time; the
    # dictionary's own bytes are charged in proportion to the sample's share of the bundle.
    without = sum(len(plain.encode(b).blob) for b in samples)
    share = len(samples) / max(total or len(blobs), len(samples))
    with_dict = sum(len(trained.encode(b).blob) for b in samples) + len(dictionary) * share
    return dictionary if with_dict < without else None


def write_bundle(path: str | Path, target: Target, entries: Iterable[tuple[str, str, bytes]], *, compiler: str,
                 binary_format: str, codec: str = "zstd", dictionary: bool | bytes = True,
                 level: int = _codec.BUNDLE_LEVEL, sources: dict[str, str] | None = None,
                 reproducible: bool = False) -> Path:
    """Write a complete bundle to ``path`` atomically.

    Args:
        path: destination ``.kdb``; replaced only once the new file is complete.
        target: what the binaries are built for.
        entries: (kernel_name, kernel_args, binary) triples, written in batches. A sequence
            is sampled at random for the dictionary; an iterator's first entries are buffered
            for training, so memory stays bounded either way.
        compiler: compiler identity, e.g. ``nvrtc 13.0``.
        binary_format: ``cubin``, ``hsaco`` or ``ocl-binary``.
        codec: ``zstd`` or ``bzip2`` (MIOpen-compatible output).
        dictionary: True to train one when it pays, False for none, or the bytes of one.
        level: zstd level.
        sources: the kernel-source manifest (file name -> digest) the entries were built from.
        reproducible: a reproducible build's bundle: no time recorded unless ``SOURCE_DATE_EPOCH``
            gives one (which is honoured either way), and marked so (``kdb_meta.reproducible``).

    Returns:
        The path written.

    Raises:
        KdbError: ``SOURCE_DATE_EPOCH`` is malformed.
    """
    path = Path(path)
    if dictionary is True and codec == "zstd":
        entries, dict_bytes = _train_on(entries, level)
    elif dictionary is True or dictionary is False:
        dict_bytes = None
    else:
        dict_bytes = dictionary

    def fill(bundle: Bundle) -> None:
        bundle.write_level = level
        it = iter(entries)
        while batch := list(itertools.islice(it, BATCH)):
            bundle.put_many(batch)

    return _write_atomically(path, target, fill, compiler=compiler, binary_format=binary_format, codec=codec,
                             dictionary=dict_bytes, sources=sources, created=created_stamp(reproducible),
                             reproducible=reproducible)


def write_stored_bundle(path: str | Path, target: Target, entries: Iterable[tuple[str, str, _codec.StoredBlob]], *,
                        compiler: str, binary_format: str, sources: dict[str, str] | None = None,
                        reproducible: bool = False) -> Path:
    """Write a complete zstd bundle without dictionary, atomically, from entries already
    encoded by :func:`kdbkit.kdb.codec.encode_for_bundle` (in an offline build's workers: the
    writer then only inserts rows, so writing does not serialise a parallel build).
    ``reproducible`` as for :func:`write_bundle`; the rows are written in the order given."""
    def fill(bundle: Bundle) -> None:
        it = iter(entries)
        while batch := list(itertools.islice(it, BATCH)):
            bundle.put_stored(batch)

    return _write_atomically(Path(path), target, fill, compiler=compiler, binary_format=binary_format, codec="zstd",
                             dictionary=None, sources=sources, created=created_stamp(reproducible),
                             reproducible=reproducible)


def _write_atomically(path: Path, target: Target, fill, **create) -> Path:
    """Create a bundle beside ``path``, let ``fill`` write its entries, compact it, and put it in
    place only once complete."""
    remove_stale_temps(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_writer_tag()}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _naming(exc, path) from exc
    os.close(fd)
    os.unlink(tmp)  # SQLite creates the file itself; mkstemp only reserved a unique name
    try:
        with Bundle.create(tmp, target, **create) as bundle:
            fill(bundle)
            bundle.compact(page_size=PAGE_SIZE)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise _naming(exc, path) from exc
    finally:
        for leftover in (tmp, tmp + "-journal"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path


def _host() -> str:
    return socket.gethostname().replace(".", "_").replace("-", "_") or "host"


def _writer_tag() -> str:
    """``<host>-<pid>``: who writes a temporary file, so that the next writer can tell it is gone."""
    return f"{_host()}-{os.getpid()}"


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, someone else's
    return False


def _writer_gone(name: str, path: Path, st: os.stat_result) -> bool:
    """Whether the writer of temporary file ``name`` (``.<bundle>.<tag>.<random>.tmp[-journal]``
    beside ``path``) is provably gone."""
    tag = name[len(path.name) + 2:].split(".", 1)[0]
    host, _, pid = tag.rpartition("-")
    if host == _host() and pid.isdigit():
        return _pid_gone(int(pid))
    return time.time() - st.st_mtime > STALE_TEMP_S


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temporary files and journals that killed writers of ``path`` left beside it.

    Returns:
        The files removed; any that cannot be removed are left (a later writer tries again).
    """
    removed = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(f".{path.name}.") and name.endswith((".tmp", ".tmp-journal"))):
            continue
        stale = path.parent / name
        try:
            if _writer_gone(name, path, stale.stat()):
                stale.unlink()
                removed.append(stale)
        except OSError:
            continue  # gone meanwhile
    return removed


def write_file_atomically(path: Path, data: bytes) -> Path:
    """Write a small file beside a bundle (its build record) as bundles are written: under a
    temporary name tagged with this writer, put in place whole, the temporaries of killed
    writers removed first."""
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_writer_tag()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _naming(exc: OSError, path: Path) -> OSError:
    """The same OS error naming the file the caller asked for: the hidden temporary name it
    carries is gone by the time the user reads it."""
    return OSError(exc.errno, exc.strerror, str(path))


def _train_on(entries: Iterable[tuple[str, str, bytes]], level: int):
    """Train a dictionary without reading every entry into memory; return (entries, dict)."""
    if isinstance(entries, Sequence):
        blobs = [e[2] for e in entries]  # references to bytes the caller already holds
        return entries, choose_dictionary(blobs, level)
    it = iter(entries)
    head = list(itertools.islice(it, MAX_TRAINING_SAMPLES))
    return itertools.chain(head, it), choose_dictionary([e[2] for e in head], level)
