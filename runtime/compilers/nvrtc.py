"""CUDA C++ to cubin with NVRTC: the CUDA JIT compiler and the offline builder's, with no GPU.

Needs no GPU and no driver: only ``cuda-bindings`` and the ``nvidia-cuda-nvrtc`` wheel, so the
builder can make cubins for any arch (sm_75 ... sm_121) on a machine without a GPU.

Output is always a cubin (SASS for one arch), never PTX: a PTX made by a newer NVRTC than the
driver fails to load (``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``), while a cubin loads on any driver
that knows its arch.

The CUDA runtime headers (``cuda_fp16.h``, ``cuda_bf16.h``) come from the ``nvidia-cuda-runtime``
wheel and are handed to NVRTC with ``-I``; a change of those headers changes what ``#include
<cuda_fp16.h>`` compiles to, so their identity is part of :meth:`NvrtcCompiler.identity`, and
so of every key: the CUDA version they declare plus a digest of the names and sizes of the
``cuda_*`` headers, read from the folder itself (never its path, which differs between machines).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from kdbkit.kdb.arch import spelling_of
from kdbkit.kdb.target import Target
from kdbkit.runtime.compilers.base import BareJob, Compiler
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError, first_error_line
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)
_ARCH_RE = spelling_of("cuda").regex  # sm_90, sm_90a, sm_120f
_REMEDY = "install the CUDA extra: pip install 'kdbkit[cuda]'"


def _nvrtc():
    """Import NVRTC's binding lazily: importing kdbkit must not load vendor libraries."""
    try:
        from cuda.bindings import nvrtc
    except Exception as e:  # ImportError, or the binding failing to find libnvrtc
        raise CompilerUnavailableError(f"NVRTC is not available ({e})", _REMEDY) from e
    return nvrtc


def _check(result, call: str, nvrtc):
    """Unpack an NVRTC ``(err, *values)`` tuple, raising on any error with the call's name."""
    err, *values = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise CompilerUnavailableError(f"{call} failed: {text.decode() if isinstance(text, bytes) else text}",
                                       _REMEDY)
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
        raise CompilerUnavailableError(f"NVRTC's library cannot be loaded ({e})", _REMEDY) from e
    return int(major), int(minor)


# Where NVIDIA's wheels put libnvrtc, below a sys.path entry (CUDA 13 and CUDA 12 layouts).
_WHEEL_LIB_DIRS = ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")
_BUILTINS_RE = re.compile(r"libnvrtc-builtins\.so\.(\d+)\.(\d+)")
_HEADER_SUBDIRS = ("nvidia/cu13/include", "nvidia/cuda_runtime/include", "nvidia/cu12/include")
_CUDART_VERSION_RE = re.compile(rb"#define\s+CUDART_VERSION\s+(\d+)")
# The headers kernels include for their element types, and the one that declares the version.
_KEYED_HEADERS = ("cuda_runtime_api.h", "cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp",
                  "cuda_fp8.h", "cuda_fp8.hpp")


@lru_cache(maxsize=1)
def _nvidia_entries() -> tuple[str, ...]:
    """The ``sys.path`` entries holding NVIDIA's wheels (an ``nvidia`` folder): one stat each.

    Both lookups below run on a user-cache hit's key, so they look only where the wheels are.
    """
    return tuple(e for e in sys.path if os.path.isdir(os.path.join(e or ".", "nvidia")))


@lru_cache(maxsize=1)
def wheel_nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's ``(major, minor)`` read from the ``nvidia-cuda-nvrtc`` wheel's file names.

    Loading libnvrtc (140 MB) is a cost a user-cache hit must not pay just to learn the
    version for its key. cuda-bindings loads NVRTC from the wheels first (then
    conda, then the system), so the wheel's ``libnvrtc-builtins.so.<major>.<minor>`` names
    the compiler that will run; :func:`compile_cuda` checks that against the loaded library.
    None when no wheel is found (the library is loaded and asked instead).
    """
    for _, names in _wheel_lib_folders():
        for n in names:
            m = _BUILTINS_RE.fullmatch(n)
            if m:
                return int(m[1]), int(m[2])
    return None


def _wheel_lib_folders():
    """(folder, its file names) of each folder where NVIDIA's wheels put a libnvrtc, in the order
    cuda-bindings looks."""
    for entry in _nvidia_entries():
        for sub in _WHEEL_LIB_DIRS:
            folder = os.path.join(entry or ".", sub)
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            if any(n.startswith("libnvrtc.so") for n in names):
                yield folder, names


@lru_cache(maxsize=1)
def cuda_headers() -> tuple[Path, str] | None:
    """The CUDA runtime header folder handed to NVRTC, and its identity; None when absent.

    The folder comes from the ``nvidia-cuda-runtime`` wheel (``nvidia/cu13/include`` for CUDA
    13, ``nvidia/cuda_runtime/include`` for 12). Its identity, ``cuda headers 13.5 #<digest>``,
    is read from the folder: the version ``cuda_runtime_api.h`` declares and a digest of the
    sizes of the headers kernels include for their types (``_KEYED_HEADERS``). (The wheel's
    metadata would name the patch release, but finding it means listing all of site-packages
    on every user-cache hit; this costs a few stats.)
    """
    for entry in _nvidia_entries():
        for sub in _HEADER_SUBDIRS:
            folder = os.path.join(entry or ".", sub)
            if os.path.isfile(os.path.join(folder, "cuda_fp16.h")):
                return Path(folder), f"cuda headers {_header_version(folder)} #{_folder_fingerprint(folder)}"
    return None


def _header_version(folder: str) -> str:
    try:
        with open(os.path.join(folder, "cuda_runtime_api.h"), "rb") as f:
            head = f.read(1 << 13)  # the define sits near the top (byte 6142 in CUDA 13.5)
            m = _CUDART_VERSION_RE.search(head) or _CUDART_VERSION_RE.search(head + f.read())
    except OSError:
        m = None
    return f"{int(m[1]) // 1000}.{int(m[1]) % 1000 // 10}" if m else "?"


def _folder_fingerprint(folder: str) -> str:
    h = hashlib.sha256()
    for name in _KEYED_HEADERS:
        try:
            size = os.stat(os.path.join(folder, name)).st_size
        except OSError:
            size = -1
        h.update(f"{name}\0{size}\n".encode())
    return h.hexdigest()[:12]


@lru_cache(maxsize=1)
def nvrtc_archs() -> tuple[str, ...] | None:
    """``sm_NN`` of every arch the installed NVRTC builds (nvrtcGetSupportedArchs), or None
    without NVRTC."""
    try:
        nvrtc = _nvrtc()
        return tuple(f"sm_{a}" for a in _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs", nvrtc))
    except CompilerUnavailableError:
        return None
    except Exception:  # the shared library itself failed to load
        return None


def nvrtc_identity() -> str:
    """``"nvrtc <major>.<minor>"`` plus the CUDA headers' identity when NVRTC is handed them."""
    major, minor = wheel_nvrtc_version() or nvrtc_version()
    headers = cuda_headers()
    return f"nvrtc {major}.{minor}" + (f" + {headers[1]}" if headers else "")


def compile_cuda(text: str, arch: str = "sm_90", options: Sequence[str] = (), *, name: str = "kernel.cu") -> bytes:
    """Compile CUDA C++ ``text`` to a cubin for ``arch`` with NVRTC.

    Args:
        text: the whole translation unit (quoted includes already inlined).
        arch: ``sm_<NN>`` (optionally ``a``/``f`` suffixed); ``compute_<NN>`` (PTX) is refused.
        options: extra NVRTC options, e.g. ``("-DTILE=16",)``.
        name: the source's file name, shown in the compiler log.

    Returns:
        The cubin (an ELF file with ``e_machine == EM_CUDA``).

    Raises:
        CompileError: the source does not compile; ``.log`` holds NVRTC's log.
        CompilerUnavailableError: NVRTC is missing, or ``arch`` is not a cubin arch.
    """
    _require_cubin_arch(arch)
    nvrtc = _nvrtc()
    opts = nvrtc_options(arch, options)
    _log.trace("nvrtc %s %s", name, " ".join(opts))
    try:
        prog = _check(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram", nvrtc)
    except CompilerUnavailableError:
        raise
    except Exception as e:
        raise CompilerUnavailableError(f"NVRTC's library cannot be loaded ({e})", _REMEDY) from e
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise _compile_error(name, arch, opts, _program_log(prog, nvrtc))
        _check_loaded_version(nvrtc_version())
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", nvrtc)
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN", nvrtc)
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _require_cubin_arch(arch: str) -> None:
    if not _ARCH_RE.fullmatch(arch):
        raise CompilerUnavailableError(
            f"cannot build a cubin for {arch!r}: expected sm_<NN> such as sm_90",
            "kdbkit stores cubins, never PTX; name a real GPU arch")


def nvrtc_options(arch: str, options: Sequence[str]) -> list[str]:
    """NVRTC's options for a cubin of ``arch``: the arch, the CUDA headers' folder, then ``options``."""
    headers = cuda_headers()
    return [f"--gpu-architecture={arch}", *([f"-I{headers[0]}"] if headers else []), *options]


def _compile_error(name: str, arch: str, opts: Sequence[str], log: str) -> CompileError:
    return CompileError(f"{name} failed to compile for {arch} with nvrtc: {first_error_line(log)}",
                        log=f"nvrtc {' '.join(opts)}\n{log}")


def _check_loaded_version(loaded: tuple[int, int]) -> None:
    """Keys were made with the wheel's version: never store a binary under another compiler's key."""
    advertised = wheel_nvrtc_version()
    if advertised is not None and advertised != tuple(loaded):
        raise CompilerUnavailableError(
            f"the NVRTC library loaded is {tuple(loaded)} but the nvidia-cuda-nvrtc wheel is {advertised}: "
            "another libnvrtc was loaded first (LD_PRELOAD, or another package)", "make one NVRTC visible")


@lru_cache(maxsize=1)
def wheel_nvrtc_library() -> str | None:
    """The path of the ``nvidia-cuda-nvrtc`` wheel's libnvrtc (the one cuda-bindings loads
    first), or None without the wheel."""
    for folder, names in _wheel_lib_folders():
        libraries = sorted(n for n in names if re.fullmatch(r"libnvrtc\.so(\.\d+)*", n))
        if libraries:
            return os.path.abspath(os.path.join(folder, libraries[0]))
    return None


def bare_cuda_job(text: str, arch: str, options: Sequence[str], name: str) -> BareJob | None:
    """:func:`compile_cuda` as packager/bare_compile.py runs it (the wheel's libnvrtc through
    ctypes), or None without the wheel's library."""
    library = wheel_nvrtc_library()
    if library is None:
        return None
    _require_cubin_arch(arch)
    opts = nvrtc_options(arch, options)

    def finish(kind: str, value, version) -> bytes:
        if kind == "unavailable":
            raise CompilerUnavailableError(f"NVRTC cannot run in the compile process: {value}", _REMEDY)
        _check_loaded_version(version)
        if kind == "error":
            raise _compile_error(name, arch, opts, value)
        return bytes(value)

    return BareJob((library, text.encode(), name.encode(), [o.encode() for o in opts]), finish)


def _program_log(prog, nvrtc) -> str:
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize", nvrtc)
    log = bytearray(size)
    _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog", nvrtc)
    return log.rstrip(b"\0").decode("utf-8", "replace")


class NvrtcCompiler(Compiler):
    """NVRTC: cubins for every ``sm_NN`` it knows, on any machine."""

    name = "nvrtc"
    backend = "cuda"
    binary_format = "cubin"
    # ptxas (inside NVRTC) orders some of its work by memory address: a program compiled twice
    # in one process, or in two processes with randomised address spaces, can get other
    # register choices. The one compile of a bare process (the standard library and NVRTC
    # alone) without address randomisation is the same every time (kdbkit.packager.fresh_compile,
    # which runs bare_job's; docs/reliability.md has the figures).
    determinism = "fresh-process"
    arch_pattern = _ARCH_RE

    def identity(self) -> str:
        return nvrtc_identity()

    def supported_archs(self) -> tuple[str, ...] | None:
        return nvrtc_archs()

    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        return compile_cuda(source.text(), target.arch, request.options, name=request.kernel_file)

    def bare_job(self, request: ProgramRequest, target: Target, source: KernelSource) -> BareJob | None:
        return bare_cuda_job(source.text(), target.arch, request.options, request.kernel_file)
