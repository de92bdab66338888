"""Offline AMD GPU builds: kernel source to a code object with a stock clang, no ROCm needed.

The builder uses this to make bundles for gfx90a, gfx942, gfx1100, ... on a machine with
neither an AMD GPU nor ROCm: Debian's ``clang-19`` + ``lld-19`` compile the kernel dialect in
HIP mode for ``amdgcn-amd-amdhsa``::

    clang-19 -x hip --offload-arch=gfx942 --cuda-device-only --no-gpu-bundle-output \
             -nogpulib -nogpuinc -O3 -o out.co kernel.c

which gives a raw ELF code object (not a clang offload bundle), loadable with
``hipModuleLoadData``. ``-nogpulib -nogpuinc`` mean no ROCm device libraries and headers, which
is why ``kernels/kdb_compat.h`` spells everything with clang builtins in its HIP branch, and
why the compiler's identity is its version alone: it is handed no header folder (the
kernel's own includes arrive inlined). OpenCL C is not used for amdgcn: it needs the device
libraries for ``get_local_id``.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from kdbkit.kdb.arch import spelling_of
from kdbkit.kdb.target import Target
from kdbkit.runtime.compilers.base import Compiler
from kdbkit.runtime.errors import CompileError, CompilerUnavailableError, first_error_line
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

# Newest first: a newer clang knows more gfx targets. Plain "clang" last, since distributions
# often ship an old default whose amdgcn backend lacks recent targets.
CLANG_CANDIDATES = ("clang-19", "clang-20", "clang-21", "clang-18", "clang")
_TARGET_RE = spelling_of("hip").full_regex  # gfx90a, gfx90a:xnack-
_TIMEOUT_S = 600
_log = get_logger(__name__)


def find_clang(candidates: Sequence[str] = CLANG_CANDIDATES) -> str | None:
    """Return the path of the first clang on PATH among ``candidates``, or ``None``."""
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    return None


def _require_clang(clang: str | None) -> str:
    path = clang or find_clang()
    if path is None:
        raise CompilerUnavailableError(
            f"no clang for amdgcn builds on PATH (looked for {', '.join(CLANG_CANDIDATES)})",
            "install it with `apt-get install clang-19 lld-19`")
    return path


@lru_cache(maxsize=8)
def clang_identity(clang: str | None = None) -> str:
    """``"clang <version>"`` of the compiler, e.g. ``"clang 19.1.7"``, read from ``--version``.

    Raises:
        CompilerUnavailableError: no clang, or its version line cannot be read.
    """
    path = _require_clang(clang)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise CompilerUnavailableError(f"{path} --version failed: {e}", "reinstall clang") from e
    m = re.search(r"clang version (\d+\.\d+\.\d+)", out)
    if not m:
        raise CompilerUnavailableError(f"cannot read a clang version from `{path} --version`: {out.splitlines()[:1]}",
                                       "put a release build of clang first on PATH")
    return f"clang {m.group(1)}"


@lru_cache(maxsize=8)
def clang_amdgcn_archs(clang: str | None = None) -> tuple[str, ...] | None:
    """Every gfx processor clang lists for amdgcn (``--print-supported-cpus``; the generic
    ``gfx9-generic``-style targets left out), or None without clang."""
    try:
        path = _require_clang(clang)
        out = subprocess.run([path, "--target=amdgcn-amd-amdhsa", "-nogpulib", "--print-supported-cpus"],
                             capture_output=True, text=True, timeout=60)
    except (CompilerUnavailableError, OSError, subprocess.SubprocessError):
        return None
    lines = (line.strip() for line in (out.stdout + out.stderr).splitlines())
    archs = [word for word in lines if spelling_of("hip").regex.fullmatch(word)]
    return tuple(sorted(set(archs), key=lambda a: (len(a), a))) or None


def compile_amdgcn(
    source: str,
    arch: str,
    options: Sequence[str] = (),
    *,
    name: str = "kernel.c",
    clang: str | None = None,
) -> bytes:
    """Compile ``source`` in HIP mode to an AMD GPU code object for ``arch``.

    Args:
        source: the whole translation unit (the kdbkit dialect, quoted includes inlined).
        arch: ``gfx942``, or with target features ``gfx90a:xnack-``.
        options: extra compiler options, e.g. ``("-DTILE=16",)``.
        name: the source's file name, shown in diagnostics.
        clang: the compiler to use; default :func:`find_clang`.

    Returns:
        The code object (ELF, ``e_machine == EM_AMDGPU``).

    Raises:
        CompileError: clang rejected the source; ``.log`` holds its diagnostics.
        CompilerUnavailableError: no clang, or ``arch`` is not a gfx target.
    """
    if not _TARGET_RE.fullmatch(arch):
        raise CompilerUnavailableError(f"{arch!r} is not an AMD GPU target",
                                       "name one as gfx<id>[:<feature>±], e.g. gfx90a:xnack-")
    path = _require_clang(clang)
    with tempfile.TemporaryDirectory(prefix="kdb-amdgcn-") as tmp:
        src = Path(tmp) / Path(name).name
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / "out.co"
        # clang names a compilation unit (__hip_cuid_...) from the file's path by default: the temporary
        # folder's would make every build differ; a digest of what is compiled makes it reproducible.
        cuid = hashlib.sha256("\0".join((source, arch, *options)).encode()).hexdigest()[:16]
        cmd = [
            path, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "--no-gpu-bundle-output",
            "-nogpulib", "-nogpuinc", "-O3", f"-cuid={cuid}",
            *options,
            "-o", str(out), str(src),
        ]  # fmt: skip
        _log.trace("%s", " ".join(cmd))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise CompilerUnavailableError(f"running {path} failed: {e}", "check the clang installation") from e
        if proc.returncode != 0 or not out.is_file():
            log = proc.stderr.strip()
            raise CompileError(f"{name} failed to compile for {arch} with {Path(path).name} (exit {proc.returncode}): "
                               f"{first_error_line(log)}", log=f"{' '.join(cmd)}\n{log}")
        return out.read_bytes()


class AmdgcnClangCompiler(Compiler):
    """A stock clang (``clang-19`` and later) building AMD code objects in HIP mode, no ROCm."""

    name = "clang"
    backend = "hip"
    binary_format = "hsaco"
    determinism = "deterministic"  # the same bytes in any process, folder or time (measured for gfx90a, gfx942)
    arch_pattern = _TARGET_RE

    def __init__(self, clang: str | None = None):
        self._clang = clang

    def identity(self) -> str:
        return clang_identity(self._clang)

    def supported_archs(self) -> tuple[str, ...] | None:
        return clang_amdgcn_archs(self._clang)

    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        return compile_amdgcn(source.text(), target.full_arch, request.options, name=request.kernel_file,
                              clang=self._clang)
