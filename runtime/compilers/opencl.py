"""The OpenCL compiler (pyopencl): builds for a local OpenCL device, PoCL on the CPU above all.

An OpenCL binary only loads on the implementation, driver and device that built it, so an
OpenCL target's arch (``ocl-<hash>``, see :func:`kdbkit.runtime.backends.opencl.opencl_arch`)
names one local device, and this compiler builds for the local device of that arch: no GPU,
and no backend, is needed (a context of its own on the device, never the backend's queue).
Its output is the driver's program binary in kdbkit's envelope (arch, length, SHA-256), which
:meth:`OpenCLBackend.load` checks before the driver sees it.
"""

from __future__ import annotations

import threading
import warnings

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends import opencl as ocl
from kdbkit.runtime.compilers.base import Compiler
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError, first_error_line
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)


class OpenCLCompiler(Compiler):
    """Builds programs for the local OpenCL device whose arch is ``arch``.

    Args:
        arch: an ``ocl-<hash>`` arch of a local device.

    Raises:
        CompilerUnavailableError: no local OpenCL device has that arch (OpenCL binaries are
            built on the machine that runs them), or pyopencl is missing.
    """

    name = "opencl"
    backend = "opencl"
    binary_format = "ocl-binary"
    # PoCL's binaries hold the path of the temporary file it compiled (in its cache folder, with a
    # random name) and a build hash over it: two builds never give the same bytes.
    determinism = "none"

    def __init__(self, arch: str):
        try:
            cl = ocl.cl_module()
        except Exception as e:
            raise CompilerUnavailableError(str(e), "install the OpenCL extra: pip install 'kdbkit[opencl]'") from e
        device = next((d for d, a in ocl.device_table(cl) if a == arch), None)
        if device is None:
            raise CompilerUnavailableError(
                f"no local OpenCL device is {arch}",
                "OpenCL binaries are built on the machine that runs them; `kdb devices` lists the local ones")
        self.arch = arch
        self._cl = cl
        self._device = device
        self._context = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenCLCompiler({self.arch!r})"

    def identity(self) -> str:
        """The OpenCL compiler, e.g. ``"pocl 3.1+debian llvm 15.0.6"`` (see
        :func:`kdbkit.runtime.backends.opencl.opencl_compiler_identity`)."""
        d = self._device
        return ocl.opencl_compiler_identity(d.platform.name, d.platform.version, d.driver_version)

    def unsupported(self, target: Target) -> str | None:
        reason = super().unsupported(target)
        if reason is None and target.arch != self.arch:
            reason = f"this compiler builds for {self.arch}, not {target.arch}"
        return reason

    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        reason = self.unsupported(target)
        if reason:
            raise CompilerUnavailableError(reason, "build OpenCL programs on the machine that runs them")
        cl, name = self._cl, request.kernel_file
        with self._lock:
            if self._context is None:
                self._context = cl.Context([self._device])
        _log.trace("opencl build %s %s", name, " ".join(request.options))
        try:
            with warnings.catch_warnings():
                # pyopencl warns on any non-empty build log; a failure below carries the log.
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program = cl.Program(self._context, source.text()).build(
                    options=list(request.options), devices=[self._device], cache_dir=False)
        except cl.Error as e:
            log = _one_mention(str(e))
            if getattr(e, "code", None) == cl.status_code.INVALID_BUILD_OPTIONS:  # the options, not the source
                raise CompileError(
                    f"{name}: the OpenCL compiler on {self._device.name.strip()} refused the options "
                    f"{' '.join(request.options)!r} ({_refused_option(log)})",
                    "fix the option: a define is -D NAME or -D NAME=VALUE (one word), other flags must be "
                    "ones this OpenCL compiler takes; the compiler's log follows", log=log) from e
            raise CompileError(f"{name} failed to compile on {self._device.name.strip()}: {first_error_line(log)}",
                               log=log + ocl.build_hint(log)) from e
        binary = program.get_info(cl.program_info.BINARIES)[0]
        if not binary:
            raise CompileError(f"{self._device.name.strip()} built {name} but returned an empty program binary",
                               "report this OpenCL driver's fault; another device may work")
        return ocl.wrap_binary(self.arch, bytes(binary))


def _one_mention(log: str) -> str:
    """pyopencl's build error with its first line said once: it reads
    ``clBuildProgram failed: CODE - clBuildProgram failed: CODE - ...`` (one per layer it passes)."""
    head, newline, rest = log.partition("\n")
    parts = head.split(" - ")
    return (parts[0] if len(set(parts)) == 1 else head) + newline + rest


def _refused_option(log: str) -> str:
    """The log's line naming the option refused (PoCL: ``Invalid build option: -fbogus``), or the status."""
    for line in log.splitlines():
        if "option" in line.lower() and not line.startswith(("clBuildProgram", "(options:")):
            return line.strip()
    return "INVALID_BUILD_OPTIONS"
