"""kdbkit's bundle format: SQLite kernel databases (``.kdb``, ``.ukdb``) in MIOpen's layout.

Public API::

    from kdb import Bundle, open_bundle, write_bundle, merge_bundles, verify_bundle, Target

This package depends on neither ``runtime`` nor ``packager``.
"""

from kdb.bundle import Bundle, BundleMetadata, BundleStats, EntryInfo, open_bundle
from kdb.errors import (
    BundleBusyError,
    BundleNameError,
    BundleNotFoundError,
    CorruptBundleError,
    CorruptEntryError,
    KdbError,
    NotABundleError,
    ReadOnlyBundleError,
    TargetMismatchError,
    UnsupportedFormatError,
)
from kdb.merge import MergeReport, merge_bundles
from kdb.target import Target, bundle_file_name, parse_bundle_file_name
from kdb.verify import VerifyReport, verify_bundle
from kdb.writer import write_bundle

__all__ = [
    "Bundle", "BundleMetadata", "BundleStats", "EntryInfo", "open_bundle", "write_bundle", "merge_bundles",
    "MergeReport", "verify_bundle", "VerifyReport", "Target", "bundle_file_name", "parse_bundle_file_name",
    "KdbError", "BundleNotFoundError", "NotABundleError", "CorruptBundleError", "CorruptEntryError",
    "UnsupportedFormatError", "TargetMismatchError", "BundleNameError", "ReadOnlyBundleError", "BundleBusyError",
]
