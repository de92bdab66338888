"""The root of kdbkit's one exception hierarchy, and the bundle format's own errors.

Every error kdbkit raises on purpose is a :class:`KdbError`. Each carries two parts: the
``problem`` (what went wrong, naming the file, key or call) and the ``remedy`` (what to do,
naming a command or variable that exists); ``str(error)`` joins them into the one line the
CLI prints. Callers that give their own advice (``kdb db verify`` reporting a damaged file)
show ``problem`` alone. The runtime's errors (devices, compilers, sources) subclass
:class:`KdbError` in ``kdbkit.runtime.errors``; ``import kdbkit`` exports them all.
"""

from __future__ import annotations


class KdbError(Exception):
    """Base class of every error kdbkit raises on purpose.

    Args:
        problem: what went wrong, naming the file, key or call involved.
        remedy: what the user can do about it; empty when the problem says it all.
    """

    def __init__(self, problem: str, remedy: str = ""):
        self.problem = problem
        self.remedy = remedy
        super().__init__(f"{problem}; {remedy}" if remedy else problem)

    def __reduce__(self):
        # Rebuilt from its message and attributes, never through __init__ again: that would take
        # the joined message for the problem and add a default remedy a second time, as every
        # error sent back by a build's worker or compile process did.
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type, args: tuple, state: dict) -> KdbError:
    error = cls.__new__(cls, *args)
    BaseException.__init__(error, *args)  # the message as it was (OSError's kinds take it only here)
    error.__dict__.update(state)
    return error


class BundleError(KdbError):
    """A bundle file cannot be used; the subclasses say why."""


class BundleNotFoundError(BundleError, FileNotFoundError):
    """A bundle file does not exist."""


class NotABundleError(BundleError):
    """The file exists but is not a kernel bundle (not SQLite, or no ``kern_db`` table)."""


class EmptyBundleError(NotABundleError):
    """An SQLite file with no tables at all: a bundle another process is creating, or an empty file."""


class CorruptBundleError(BundleError):
    """The file is a bundle but damaged: truncated, failed integrity check, bad metadata."""


class CorruptEntryError(CorruptBundleError):
    """One entry's blob does not decode, is too large, or does not match its ``kernel_hash``."""

    def __init__(self, problem: str, remedy: str = "", *, path: str = "", kernel_name: str = "",
                 kernel_args: str = ""):
        super().__init__(problem, remedy)
        self.path = path
        self.kernel_name = kernel_name
        self.kernel_args = kernel_args


class CodecError(KdbError, ValueError):
    """A blob cannot be decoded or hashed (garbage frame, wrong size, unknown codec or hash)."""


class UnsupportedFormatError(BundleError):
    """The bundle was written by a newer format version than this kdbkit reads."""


class TargetMismatchError(BundleError):
    """Bundles for different targets were combined, or a bundle does not fit a device."""


class BundleNameError(KdbError, ValueError):
    """A target or file name does not follow ``<arch>_<cu>.kdb``, ``<arch>.kdb`` or ``<arch>.ukdb``."""


class BundleBusyError(BundleError):
    """Another connection holds a lock longer than the busy timeout; retrying may succeed."""


class BundleWriteError(BundleError):
    """The file or its folder cannot be written: read-only, no permission, disk full, I/O error."""


class ReadOnlyBundleError(BundleError):
    """A write was attempted on a bundle opened read-only."""


class SigningKeyError(KdbError):
    """A signing or public key file cannot be used: missing, unreadable, not an Ed25519 key in PEM,
    encrypted, or (a private key) readable by other users."""
