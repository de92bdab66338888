"""hiprtc, through ``hip-python``: the HIP JIT compiler on a machine with ROCm, no GPU needed.

hiprtc compiles for any ``gfx`` target it knows (``--offload-arch=gfx90a:xnack-``) without
opening a device; it needs ROCm's ``libhiprtc`` and hip-python. Its identity is
``hiprtc <major>.<minor>``: its own device headers ship with it, and the kernel's quoted
includes arrive inlined, so no header folder is handed to it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.hip import check_hip_result
from kdbkit.runtime.compilers.base import Compiler
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError, first_error_line
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)
_REMEDY = "install ROCm and the HIP extra: pip install 'kdbkit[hip]'"


def _hiprtc():
    """Import hiprtc's binding lazily; importing kdbkit must not load ROCm."""
    try:
        from hip import hiprtc
    except Exception as e:  # ImportError, or the binding failing to find libhiprtc
        raise CompilerUnavailableError(f"hiprtc is not available ({e})", _REMEDY) from e
    return hiprtc


def _check(result, call: str):
    return check_hip_result(result, call, CompilerUnavailableError, _REMEDY)


@lru_cache(maxsize=1)
def hiprtc_identity() -> str:
    """``"hiprtc <major>.<minor>"``; raises CompilerUnavailableError without ROCm."""
    rtc = _hiprtc()
    try:
        major, minor = _check(rtc.hiprtcVersion(), "hiprtcVersion")
    except CompilerUnavailableError:
        raise
    except Exception as e:  # the library itself failed to load
        raise CompilerUnavailableError(f"hiprtc cannot report its version ({e})", _REMEDY) from e
    return f"hiprtc {major}.{minor}"


class HiprtcCompiler(Compiler):
    """ROCm's runtime compiler: code objects for the gfx targets it knows."""

    name = "hiprtc"
    backend = "hip"
    binary_format = "hsaco"
    arch_pattern = re.compile(r"gfx[0-9a-f]+(?::[a-z][a-z0-9]*[+-])*")

    def identity(self) -> str:
        return hiprtc_identity()

    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        rtc = _hiprtc()
        name = request.kernel_file
        opts = [f"--offload-arch={target.full_arch}", "-O3", *request.options]
        _log.trace("hiprtc %s %s", name, " ".join(opts))
        prog = _check(rtc.hiprtcCreateProgram(source.text().encode(), name.encode(), 0, [], []), "hiprtcCreateProgram")
        try:
            encoded = [o.encode() for o in opts]
            (err,) = rtc.hiprtcCompileProgram(prog, len(encoded), encoded)
            if int(getattr(err, "value", err)) != 0:
                size = _check(rtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
                log_buf = bytearray(size)
                _check(rtc.hiprtcGetProgramLog(prog, log_buf), "hiprtcGetProgramLog")
                log = log_buf.rstrip(b"\0").decode("utf-8", "replace")
                raise CompileError(f"{name} failed to compile for {target.full_arch} with hiprtc: "
                                   f"{first_error_line(log)}", log=f"hiprtc {' '.join(opts)}\n{log}")
            size = _check(rtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
            code = bytearray(size)
            _check(rtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
            return bytes(code)
        finally:
            rtc.hiprtcDestroyProgram(prog)  # issue 11: hiprtc takes a pointer to the handle here
