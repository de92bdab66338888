"""The compile process of a reproducible build: NVRTC called through ctypes by a bare Python
(``python -I -S -B`` running this file: the standard library only; no site-packages, no numpy,
no kdbkit), so that nothing but the compile itself allocates beside the compiler.

ptxas (inside NVRTC) orders some of its work by memory address, so the cubin follows where its
data lies, and so everything the process did before the compile (docs/reliability.md). This
process turns address randomisation off for itself (``personality(ADDR_NO_RANDOMIZE)``, as
``setarch -R`` does) and executes itself again; then reads the job from stdin (a pickle of plain
values: the library's path, the source, its name and the options), checks that it runs alone (no
other thread), compiles once and writes the outcome to stdout. kdbkit's side of it is
:mod:`kdbkit.packager.fresh_compile`. Run by path, never imported by kdbkit.
"""

import ctypes
import os
import pickle
import sys

ADDR_NO_RANDOMIZE = 0x0040000  # <linux/personality.h>
_QUERY = 0xFFFFFFFF  # personality(0xffffffff) reads the persona without changing it
RANDOMISED = ("the address space of the compiler's process could not be fixed (personality refused), "
              "so its output may vary")


def _fix_address_space() -> str:
    """Execute this process again without address randomisation, unless it already runs so;
    return ``""`` once it does, else why it cannot."""
    if not sys.platform.startswith("linux"):
        return f"{RANDOMISED} (not Linux)"
    try:
        personality = ctypes.CDLL(None, use_errno=True).personality
    except (OSError, AttributeError):
        return f"{RANDOMISED} (no personality call)"
    current = personality(_QUERY)
    if current != -1 and current & ADDR_NO_RANDOMIZE:
        return ""
    if current == -1 or personality(current | ADDR_NO_RANDOMIZE) == -1:
        return RANDOMISED
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # the persona takes effect at exec
    return RANDOMISED  # not reached


def _other_threads() -> str:
    try:
        count = len(os.listdir("/proc/self/task"))
    except OSError:
        return ""
    return "" if count == 1 else (f"the compiler's process ran {count} threads, so its output may vary with "
                                  "when they ran")


def _compile(library: str, text: bytes, name: bytes, options: list) -> tuple:
    """("ok", cubin, version) or ("error", log, version) or ("unavailable", why, None)."""
    try:
        nvrtc = ctypes.CDLL(library)
    except OSError as exc:
        return "unavailable", f"{library} cannot be loaded ({exc})", None
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    size_t = ctypes.c_size_t

    def check(result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} failed: {nvrtc.nvrtcGetErrorString(result).decode()}")

    major, minor = ctypes.c_int(), ctypes.c_int()
    prog = ctypes.c_void_p()
    try:
        check(nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        version = (major.value, minor.value)
        check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), ctypes.c_char_p(text), ctypes.c_char_p(name), 0, None, None),
              "nvrtcCreateProgram")
    except RuntimeError as exc:
        return "unavailable", str(exc), None
    try:
        argv = (ctypes.c_char_p * max(len(options), 1))(*options)
        result = nvrtc.nvrtcCompileProgram(prog, len(options), argv)
        if result != 0:
            log_size = size_t()
            check(nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(log_size.value)
            check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            return "error", log.raw.rstrip(b"\0").decode("utf-8", "replace"), version
        cubin_size = size_t()
        check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(cubin_size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(cubin_size.value)
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return "ok", cubin.raw, version
    except RuntimeError as exc:
        return "unavailable", str(exc), None
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def main() -> int:
    note = _fix_address_space()
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the compiler prints goes to stderr, never into the outcome
    library, text, name, options = pickle.load(sys.stdin.buffer)
    note = note or _other_threads()
    kind, value, version = _compile(library, text, name, options)
    result.write(pickle.dumps((kind, value, version, note)))
    result.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
