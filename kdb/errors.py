"""The exception hierarchy shared by every layer of kdbkit.

Each message names the file or key involved and the remedy, because the people who see
these errors are users of libraries built on kdbkit, not its authors. The CLI prints
``str(error)`` on one line instead of a traceback.
"""

from __future__ import annotations


class KdbError(Exception):
    """Base class of every error kdbkit raises on purpose."""


class BundleNotFoundError(KdbError, FileNotFoundError):
    """A bundle file does not exist."""


class NotABundleError(KdbError):
    """The file exists but is not a kernel bundle (not SQLite, or no ``kern_db`` table)."""


class CorruptBundleError(KdbError):
    """The file is a bundle but damaged: truncated, failed integrity check, bad metadata."""


class CorruptEntryError(CorruptBundleError):
    """One entry's blob does not decode or does not match its ``kernel_hash``."""

    def __init__(self, message: str, *, path: str = "", kernel_name: str = "", kernel_args: str = ""):
        super().__init__(message)
        self.path = path
        self.kernel_name = kernel_name
        self.kernel_args = kernel_args


class UnsupportedFormatError(KdbError):
    """The bundle was written by a newer format version than this kdbkit reads."""


class TargetMismatchError(KdbError):
    """Bundles for different targets were combined, or a bundle does not fit a device."""


class BundleNameError(KdbError, ValueError):
    """A file name does not follow ``<arch>_<cu>.kdb``, ``<arch>.kdb`` or ``<name>.ukdb``."""


class BundleBusyError(KdbError):
    """Another connection holds a lock longer than the busy timeout; retrying may succeed."""


class ReadOnlyBundleError(KdbError):
    """A write was attempted on a bundle opened read-only."""
