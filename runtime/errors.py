"""The runtime's errors: one module, all below :class:`kdbkit.kdb.errors.KdbError`.

They follow the bundle format's convention (a ``problem`` naming the file, key or call, and a
``remedy`` naming a command or variable that exists), so the CLI prints every one of them as
one line. A vendor call that fails (:class:`DeviceCallError`) is not the same as a vendor
library that is missing (:class:`BackendUnavailableError`): the first is a fault to report,
the second a setup step to take.
"""

from __future__ import annotations

from kdbkit.kdb.errors import KdbError


class OptionsError(KdbError, ValueError):
    """Compile options that cannot be normalised: a malformed ``-D``, a macro defined twice."""


class KernelSourceError(KdbError, FileNotFoundError):
    """A kernel source, or a file it includes, cannot be found or read."""


class BackendUnavailableError(KdbError):
    """The vendor library for this backend is not installed, or it finds no device."""


class HandleClosedError(KdbError):
    """A handle (or the backend it drives) was used after ``close()``."""

    def __init__(self, problem: str = "the handle is closed", remedy: str = "make a new one (kdbkit.Handle())"):
        super().__init__(problem, remedy)


class DeviceCallError(KdbError):
    """A CUDA or HIP call returned an error; the message names the call and the error code."""


class CompilerUnavailableError(KdbError):
    """A compiler is missing, cannot report its version, or cannot build for a target."""


class CompileError(KdbError):
    """The compiler rejected a kernel source.

    ``problem`` is one line (the file, the target, the compiler and its first error); ``log``
    holds the compiler's whole log, which the CLI prints below the line.
    """

    def __init__(self, problem: str, remedy: str = "fix the source; the compiler's log follows", *, log: str = ""):
        super().__init__(problem, remedy)
        self.log = log

    def __str__(self) -> str:
        return super().__str__() + (f"\n{self.log}" if self.log else "")


class BinaryLoadError(KdbError):
    """A binary could not be loaded on the device (wrong arch, corrupt, refused by the driver)."""


class LaunchError(DeviceCallError):
    """The driver refused or failed a kernel launch."""


class LaunchArgumentError(KdbError, TypeError):
    """A launch argument is neither a device buffer of this backend nor a NumPy scalar."""


class TransferError(KdbError, ValueError):
    """A host array does not fit a copy to or from a device buffer."""


class ProblemError(KdbError, ValueError):
    """A primitive's arguments do not make a problem: a mismatched shape, an unsupported type or
    layout, a size below 1, a malformed config string. Raised before anything is launched."""


class NoSolverError(KdbError):
    """No solver applies to a problem (each solver's reason is in the message), or the one asked
    for (``KDB_DEBUG_FIND_ONLY_SOLVER``, ``solver=``) does not exist or does not apply."""


class NumericsError(KdbError, ArithmeticError):
    """KDB_CHECK_NUMERICS (with 0x04) found inf, NaN or all zeros in a primitive's tensor."""


class JitDisabledError(KdbError):
    """A program is in no bundle or cache and ``KDB_DISABLE_JIT`` or ``KDB_CACHE_POLICY`` forbids compiling it."""


class ExportError(KdbError):
    """``kdb cache export`` cannot start: no user cache, an unknown target, an output folder it
    may not write or that holds files already, a cache folder others may write."""


def first_error_line(log: str) -> str:
    """The line of a compiler log that says what failed: the first one naming an error."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[0] if lines else "no log"
