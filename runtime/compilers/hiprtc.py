"""hiprtc, through ``hip-python``: the HIP JIT compiler on a machine with ROCm, no GPU needed.

hiprtc compiles for any ``gfx`` target it knows (``--offload-arch=gfx90a:xnack-``) without
opening a device; it needs ROCm's ``libhiprtc`` and hip-python. Its identity is
``hiprtc <major>.<minor>``: its own device headers ship with it, and the kernel's quoted
includes arrive inlined, so no header folder is handed to it.
"""

from __future__ import annotations

from functools import lru_cache

from kdbkit.kdb.arch import spelling_of
from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.hip_binding import destroy_program, hip_call, load_hiprtc
from kdbkit.runtime.compilers.base import Compiler
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError, first_error_line
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)


def _call(fn, *args, call: str):
    return hip_call(fn, *args, call=call, error=CompilerUnavailableError, unavailable=CompilerUnavailableError)


@lru_cache(maxsize=1)
def hiprtc_identity() -> str:
    """``"hiprtc <major>.<minor>"``; raises CompilerUnavailableError without ROCm."""
    major, minor = _call(load_hiprtc().hiprtcVersion, call="hiprtcVersion")
    return f"hiprtc {major}.{minor}"


class HiprtcCompiler(Compiler):
    """ROCm's runtime compiler: code objects for the gfx targets it knows."""

    name = "hiprtc"
    backend = "hip"
    binary_format = "hsaco"
    arch_pattern = spelling_of("hip").full_regex

    def identity(self) -> str:
        return hiprtc_identity()

    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        rtc = load_hiprtc()
        name = request.kernel_file
        opts = [f"--offload-arch={target.full_arch}", "-O3", *request.options]
        _log.trace("hiprtc %s %s", name, " ".join(opts))
        prog = _call(rtc.hiprtcCreateProgram, source.text().encode(), name.encode(), 0, [], [],
                     call="hiprtcCreateProgram")
        try:
            code = self._compile(rtc, prog, name, target, opts)
        except BaseException:
            try:
                destroy_program(rtc, prog)
            except Exception as e:  # the compile error is the one to report
                _log.warning("after a failed compile of %s: %s", name, getattr(e, "problem", e))
            raise
        destroy_program(rtc, prog)
        return code

    @staticmethod
    def _compile(rtc, prog, name: str, target: Target, opts: list[str]) -> bytes:
        encoded = [o.encode() for o in opts]
        # A failed compile is not a failed call: the program log says why.
        err = rtc.hiprtcCompileProgram(prog, len(encoded), encoded)[0]
        if int(getattr(err, "value", err)) != 0:
            size = _call(rtc.hiprtcGetProgramLogSize, prog, call="hiprtcGetProgramLogSize")
            log_buf = bytearray(size)
            _call(rtc.hiprtcGetProgramLog, prog, log_buf, call="hiprtcGetProgramLog")
            log = log_buf.rstrip(b"\0").decode("utf-8", "replace")
            raise CompileError(f"{name} failed to compile for {target.full_arch} with hiprtc: "
                               f"{first_error_line(log)}", log=f"hiprtc {' '.join(opts)}\n{log}")
        size = _call(rtc.hiprtcGetCodeSize, prog, call="hiprtcGetCodeSize")
        code = bytearray(size)
        _call(rtc.hiprtcGetCode, prog, code, call="hiprtcGetCode")
        return bytes(code)
