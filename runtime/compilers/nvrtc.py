"""CUDA C++ to cubin with NVRTC: the JIT compiler of the CUDA backend and the offline builder.

Needs no GPU and no driver: only ``cuda-bindings`` and the ``nvidia-cuda-nvrtc`` wheel, so the
packager can build cubins for any arch (sm_75 ... sm_121) on a machine without a GPU.

Output is always a cubin (SASS for one arch), never PTX: a PTX made by a newer NVRTC than the
driver fails to load (``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``), while a cubin loads on any driver
that knows its arch.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from kdbkit.runtime.backends.base import CompileError, CompilerUnavailableError

_ARCH_RE = re.compile(r"sm_\d+[af]?")
_REMEDY = "install the CUDA extra: pip install 'kdbkit[cuda]'"


def _nvrtc():
    """Import NVRTC's binding lazily: importing kdbkit must not load vendor libraries."""
    try:
        from cuda.bindings import nvrtc
    except Exception as e:  # ImportError, or the binding failing to find libnvrtc
        raise CompilerUnavailableError(f"NVRTC is not available ({e}); {_REMEDY}") from e
    return nvrtc


def _check(result, call: str, nvrtc):
    """Unpack an NVRTC ``(err, *values)`` tuple, raising on any error with the call's name."""
    err, *values = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise CompilerUnavailableError(f"{call} failed: {text.decode() if isinstance(text, bytes) else text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int]:
    """Return NVRTC's ``(major, minor)``.

    Raises:
        CompilerUnavailableError: NVRTC is not installed or its library cannot be loaded.
    """
    nvrtc = _nvrtc()
    try:
        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion", nvrtc)
    except CompilerUnavailableError:
        raise
    except Exception as e:  # the shared library itself failed to load
        raise CompilerUnavailableError(f"NVRTC's library cannot be loaded ({e}); {_REMEDY}") from e
    return int(major), int(minor)


# Where NVIDIA's wheels put libnvrtc, below a sys.path entry (CUDA 13 and CUDA 12 layouts).
_WHEEL_LIB_DIRS = ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")
_BUILTINS_RE = re.compile(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)")


@lru_cache(maxsize=1)
def wheel_nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's ``(major, minor)`` read from the ``nvidia-cuda-nvrtc`` wheel's file names.

    Loading libnvrtc (140 MB) takes about 100 ms, a cost a user-cache hit must not pay just
    to learn the version for its key. cuda-bindings loads NVRTC from the wheels first (then
    conda, then the system), so the wheel's ``libnvrtc-builtins.so.<major>.<minor>`` names
    the compiler that will run; :func:`compile_cuda` checks that against the loaded library.
    None when no wheel is found (the library is loaded and asked instead).
    """
    for entry in sys.path:
        for sub in _WHEEL_LIB_DIRS:
            try:
                names = os.listdir(os.path.join(entry or ".", sub))
            except OSError:
                continue
            if not any(n.startswith("libnvrtc.so") for n in names):
                continue
            for n in names:
                m = _BUILTINS_RE.fullmatch(n)
                if m:
                    return int(m[1]), int(m[2])
    return None


def nvrtc_identity() -> str:
    """``"nvrtc <major>.<minor>"``, the compiler identity recorded in bundles and cache keys."""
    major, minor = wheel_nvrtc_version() or nvrtc_version()
    return f"nvrtc {major}.{minor}"


@lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[Path, ...]:
    """Folders holding the CUDA runtime headers (``cuda_fp16.h``, ``cuda_bf16.h``, ...).

    They come from the ``nvidia-cuda-runtime`` wheel, whose layout changed between CUDA 12
    (``nvidia/cuda_runtime/include``) and CUDA 13 (``nvidia/cu13/include``); both are looked
    for. Returns an empty tuple when the wheel is absent: kernels that include no CUDA header
    still compile.
    """
    try:
        import nvidia  # namespace package shared by NVIDIA's wheels
    except ImportError:
        return ()
    found = []
    for root in map(Path, getattr(nvidia, "__path__", [])):
        for sub in ("cu13/include", "cuda_runtime/include", "cu12/include"):
            candidate = root / sub
            if (candidate / "cuda_fp16.h").is_file() and candidate not in found:
                found.append(candidate)
    return tuple(found)


def compile_cuda(
    source: str,
    arch: str = "sm_90",
    options: Sequence[str] = (),
    include_dirs: Sequence[Path] = (),
    *,
    name: str = "kernel.cu",
) -> bytes:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` with NVRTC.

    Args:
        source: the kernel source text.
        arch: ``sm_<NN>`` (optionally ``a``/``f`` suffixed); ``compute_<NN>`` (PTX) is refused.
        options: extra NVRTC options, e.g. ``("-DTILE=16",)``.
        include_dirs: folders searched by ``#include "..."`` (passed as ``-I``); the CUDA
            runtime header folder is always added after them.
        name: the source's file name, shown in the compiler log.

    Returns:
        The cubin (an ELF file with ``e_machine == EM_CUDA``).

    Raises:
        CompileError: the source does not compile; the message holds NVRTC's log.
        CompilerUnavailableError: NVRTC is missing, or ``arch`` is not a cubin arch.
    """
    if not _ARCH_RE.fullmatch(arch):
        raise CompilerUnavailableError(
            f"cannot build a cubin for {arch!r}: expected sm_<NN> such as sm_90 (kdbkit stores cubins, never PTX)"
        )
    nvrtc = _nvrtc()
    opts = [f"--gpu-architecture={arch}"]
    opts += [f"-I{d}" for d in (*include_dirs, *cuda_include_dirs())]
    opts += list(options)
    try:
        prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram", nvrtc)
    except CompilerUnavailableError:
        raise
    except Exception as e:
        raise CompilerUnavailableError(f"NVRTC's library cannot be loaded ({e}); {_REMEDY}") from e
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = _program_log(prog, nvrtc)
            raise CompileError(
                f"{name} failed to compile for {arch} with nvrtc ({' '.join(opts)}):\n{log}"
            )
        advertised = wheel_nvrtc_version()
        if advertised is not None and advertised != nvrtc_version():
            # Keys were made with the wheel's version: never store a binary under another compiler's key.
            raise CompilerUnavailableError(
                f"the NVRTC library loaded is {nvrtc_version()} but the nvidia-cuda-nvrtc wheel is {advertised}; "
                "another libnvrtc was loaded first (LD_PRELOAD, or another package): make one NVRTC visible")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", nvrtc)
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN", nvrtc)
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(prog, nvrtc) -> str:
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize", nvrtc)
    log = bytearray(size)
    _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog", nvrtc)
    return log.rstrip(b"\0").decode("utf-8", "replace")
