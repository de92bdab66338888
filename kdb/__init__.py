"""kdbkit's bundle format: SQLite kernel databases (``.kdb``, ``.ukdb``) in MIOpen's layout.

Public API::

    from kdbkit.kdb import Bundle, open_bundle, write_bundle, merge_bundles, verify_bundle, Target

This package depends on neither ``runtime`` nor ``packager``.
"""

from kdbkit.kdb.bundle import Bundle, BundleMetadata, BundleStats, EntryInfo, open_bundle
from kdbkit.kdb.errors import (
    BundleBusyError,
    BundleError,
    BundleNameError,
    BundleNotFoundError,
    BundleWriteError,
    CodecError,
    CorruptBundleError,
    CorruptEntryError,
    EmptyBundleError,
    KdbError,
    NotABundleError,
    ReadOnlyBundleError,
    TargetMismatchError,
    UnsupportedFormatError,
)
from kdbkit.kdb.merge import MergeReport, merge_bundles
from kdbkit.kdb.target import Target, bundle_file_name, parse_bundle_file_name
from kdbkit.kdb.verify import VerifyReport, verify_bundle
from kdbkit.kdb.writer import write_bundle

__all__ = [
    "Bundle", "BundleMetadata", "BundleStats", "EntryInfo", "open_bundle", "write_bundle", "merge_bundles",
    "MergeReport", "verify_bundle", "VerifyReport", "Target", "bundle_file_name", "parse_bundle_file_name",
    "KdbError", "BundleNotFoundError", "NotABundleError", "CorruptBundleError", "CorruptEntryError",
    "UnsupportedFormatError", "TargetMismatchError", "BundleNameError", "ReadOnlyBundleError", "BundleBusyError",
    "BundleError", "BundleWriteError", "CodecError", "EmptyBundleError",
]
