"""Split one bundle into several of the same target, each under a size.

A package index, a registry or a filesystem limits the size of one file (PyPI: 100 MiB by
default, 1 GiB at most on request; FlashInfer's per-arch wheels outgrew that and split by SM
family), and a target's bundle can outgrow it. The runtime already reads several bundles of one
target in turn (each installed package's folder is a search folder: runtime/system_bundles.py), so
a split bundle needs nothing new there: every part is an ordinary bundle of the whole's target,
compiler and kernel-source manifest, holding some of its entries.

Entries go to the parts in key order (kernel name, then arguments), so a kernel's programs stay
together and a process that uses a few kernels opens few parts. The cut points depend only on
the entries and the size, so the same bundle splits the same way on any machine. Entries are
copied as stored where the bundle stores them as the offline builder does (zstd, no dictionary);
others are decoded, checked and encoded again that way (parts carry no dictionary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kdbkit.kdb.bundle import EntryInfo, open_bundle
from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.writer import write_stored_bundle

# What a part's file holds beyond its entries' stored bytes: SQLite's pages and index, the
# metadata; an estimate that only decides where to cut (the caller checks what it wrote).
ROW_OVERHEAD = 64
FILE_OVERHEAD = 16 << 10


class SplitError(KdbError):
    """A bundle that cannot be split under the size asked for: one program is too large.

    Attributes:
        program: that program's key, as ``name [args]``.
        needed: the smallest part size that would hold it.
    """

    def __init__(self, program: str, takes: int, max_bytes: int):
        self.program, self.needed = program, takes + FILE_OVERHEAD
        super().__init__(f"its largest program, {program}, takes {takes} bytes: a part of at most {max(max_bytes, 0)} "
                         f"bytes, its file's own pages ({FILE_OVERHEAD}) included, cannot hold it",
                         f"allow parts of at least {self.needed} bytes")


@dataclass(frozen=True)
class Part:
    """One part written: its file and how many entries it holds."""

    path: Path
    entries: int


def entry_bytes(e: EntryInfo) -> int:
    """What one entry adds to a bundle's file, estimated."""
    return e.stored_size + len(e.kernel_name.encode()) + len(e.kernel_args.encode()) + ROW_OVERHEAD


def plan_parts(entries: list[EntryInfo], max_bytes: int) -> list[list[tuple[str, str]]]:
    """The keys of each part, in key order: as few parts as keep each under ``max_bytes``
    (estimated), their sizes as even as the entries allow.

    Raises:
        SplitError: one entry alone would pass ``max_bytes``.
    """
    budget = max_bytes - FILE_OVERHEAD
    ordered = sorted(entries, key=lambda e: (e.kernel_name, e.kernel_args))
    largest = max(ordered, key=entry_bytes, default=None)
    if largest is not None and entry_bytes(largest) > budget:
        raise SplitError(f"{largest.kernel_name} [{largest.kernel_args}]", entry_bytes(largest), max_bytes)
    total = sum(entry_bytes(e) for e in ordered)
    aim = total / max(1, math.ceil(total / budget))  # even parts, so the last is not a sliver
    parts: list[list[tuple[str, str]]] = [[]]
    filled = 0
    for e in ordered:
        size = entry_bytes(e)
        if parts[-1] and (filled + size > budget or filled >= aim):
            parts.append([])
            filled = 0
        parts[-1].append((e.kernel_name, e.kernel_args))
        filled += size
    return parts


def split_bundle(path: Path, out: Path, max_bytes: int) -> list[Part]:
    """Write ``path``'s entries into parts of at most about ``max_bytes`` each: ``out/1/<name>``,
    ``out/2/<name>``, ... (the bundle's own file name in each); one part when it fits whole.

    Raises:
        SplitError: an entry alone passes ``max_bytes``.
        KdbError subclasses: the bundle does not open, or an entry fails its check (CorruptEntryError).
    """
    with open_bundle(path) as bundle:
        md = bundle.metadata
        written = []
        for i, part in enumerate(plan_parts(list(bundle.entries()), max_bytes)):
            folder = out / str(i + 1)
            folder.mkdir(parents=True, exist_ok=True)
            # each entry read (and checked) once, by its key, in the part's key order
            mine = ((name, args, bundle.stored_item(name, args)) for name, args in part)
            written.append(Part(write_stored_bundle(folder / path.name, md.target, mine, compiler=md.compiler,
                                                    binary_format=md.binary_format, sources=md.source_digests or None,
                                                    reproducible=md.reproducible), len(part)))
    return written
