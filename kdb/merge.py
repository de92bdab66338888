"""Merge several bundles into one.

Inputs must describe the same target and compiler: a bundle holds binaries for one target,
and the runtime trusts its metadata. ``allow_mixed_cu`` relaxes one thing only: inputs
for the same arch with different CU counts merge into an arch-wide bundle (MIOpen's
packages duplicate identical code objects per CU count; merging removes the copies).
Identical keys with identical bytes are kept once; identical keys with different bytes are
a conflict, resolved in favour of the first input and reported. Entries stream from the
inputs to the output in key order, each read by its key; only the keys, which inputs hold them,
and a training sample are held in memory. Key order makes the output the same whatever the order
of the inputs (but for a conflict's winner) and the same as one build of the whole writes it: the
shards of a reproducible build merge into the bytes a one-machine build gives (where no
dictionary pays, or with ``dictionary=False``: the builder trains none).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from kdbkit.kdb.bundle import Bundle, open_bundle
from kdbkit.kdb.errors import BundleWriteError, KdbError, TargetMismatchError
from kdbkit.kdb.writer import choose_dictionary, training_sample, write_bundle


@dataclass
class MergeReport:
    out: Path
    entries: int = 0
    duplicates: int = 0
    conflicts: list[tuple[str, str]] = field(default_factory=list)


def merge_bundles(out: str | Path, inputs: list[str | Path], *, allow_mixed_cu: bool = False,
                  dictionary: bool = True) -> MergeReport:
    """Merge ``inputs`` into a new bundle at ``out`` (written atomically).

    Args:
        out: the output ``.kdb``; may be one of the inputs.
        inputs: bundles to read, first one wins on conflicts.
        allow_mixed_cu: merge the same arch across CU counts into an arch-wide bundle.
        dictionary: train a zstd dictionary for the output when it pays.

    Returns:
        A report: entries written, exact duplicates dropped, conflicting keys.

    Raises:
        BundleWriteError: ``out`` is a folder.
        TargetMismatchError: inputs differ in backend, arch, features or compiler (or CU
            count without ``allow_mixed_cu``); the message names both files.
        KdbError subclasses for unreadable inputs, and CorruptEntryError for bad entries
            (nothing is written then).
    """
    if not inputs:
        raise KdbError("merge needs at least one input bundle", "name the bundles to merge")
    bundles: list[Bundle] = [open_bundle(p) for p in inputs]
    try:
        target, compiler, binary_format = _common_target(bundles, allow_mixed_cu)
        if Path(out).is_dir():  # refused before the dictionary's training, not at the final rename
            raise BundleWriteError(f"{out} is a folder", f"name the bundle file to write, e.g. "
                                   f"{Path(out) / target.bundle_name()}")
        report = MergeReport(Path(out))
        holders = _holders(bundles)
        dict_bytes = None
        if dictionary:
            # A seeded random sample of the keys (cheap), then only the chosen blobs read.
            chosen = training_sample(sorted(holders))
            dict_bytes = choose_dictionary([holders[k][0].get(*k) for k in chosen], total=len(holders))
        write_bundle(out, target, _unique(holders, report), compiler=compiler, binary_format=binary_format,
                     dictionary=dict_bytes or False, sources=_merged_sources(bundles),
                     reproducible=all(b.metadata.reproducible for b in bundles))
        return report
    finally:
        for b in bundles:
            b.close()


def _merged_sources(bundles: list[Bundle]) -> dict[str, str]:
    """The inputs' kernel-source manifests joined; a file the inputs built from different
    sources is left out (its programs stay keyed by their own digests; only the up-front
    digest is lost). Empty when any input has none: the manifest must cover every entry."""
    manifests = [b.metadata.source_digests for b in bundles]
    if not all(manifests):
        return {}
    joined: dict[str, str] = {}
    for manifest in manifests:
        joined.update(manifest)
    return {name: digest for name, digest in joined.items()
            if all(m.get(name, digest) == digest for m in manifests)}


def _holders(bundles: list[Bundle]) -> dict[tuple[str, str], list[Bundle]]:
    """Each key and the inputs holding it, in the inputs' order (the first one wins)."""
    holders: dict[tuple[str, str], list[Bundle]] = {}
    for bundle in bundles:
        for e in bundle.entries():
            holders.setdefault((e.kernel_name, e.kernel_args), []).append(bundle)
    return holders


def _unique(holders: dict[tuple[str, str], list[Bundle]], report: MergeReport) -> Iterator[tuple[str, str, bytes]]:
    """Every key once, in key order, with the first holder's bytes; the others' copies counted
    as duplicates (same bytes) or conflicts (other bytes). Every copy is read, so a damaged one
    raises CorruptEntryError before anything is written."""
    for key in sorted(holders):
        first, *others = holders[key]
        data = first.get(*key)
        h = hashlib.sha256(data).digest()
        for other in others:
            if hashlib.sha256(other.get(*key)).digest() == h:
                report.duplicates += 1
            else:
                report.conflicts.append(key)
        report.entries += 1
        yield key[0], key[1], data


def _common_target(bundles: list[Bundle], allow_mixed_cu: bool):
    first = bundles[0]
    base = first.metadata.target
    if base is None:
        raise TargetMismatchError(f"{first.path}: names no target (a MIOpen file with a non-standard name)",
                                  "rename it <arch>_<cu>.kdb before merging")
    for other in bundles[1:]:
        t, m = other.metadata.target, other.metadata
        where = f"{first.path} is {base}, {other.path} is {t}"
        if t is None or (t.backend, t.arch, t.features) != (base.backend, base.arch, base.features):
            raise TargetMismatchError(f"cannot merge bundles for different targets: {where}",
                                      "merge bundles of one target only")
        if t.cu != base.cu:
            if not allow_mixed_cu:
                raise TargetMismatchError(f"cannot merge bundles for different CU counts: {where}",
                                          "pass --allow-mixed-cu to produce an arch-wide bundle")
            base = replace(base, cu=None)
        if m.compiler != first.metadata.compiler or m.binary_format != first.metadata.binary_format:
            raise TargetMismatchError(
                f"cannot merge bundles built by different compilers: {first.path} by "
                f"{first.metadata.compiler or 'unknown'}, {other.path} by {m.compiler or 'unknown'}",
                "rebuild them with one compiler")
    return base, first.metadata.compiler, first.metadata.binary_format
