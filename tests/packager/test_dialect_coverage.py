"""The dialect kernel uses every macro of kdb_compat.h, and compiles with every compiler installed here.

``kernels/dialect_everything.c`` is what the AMD code-object checks run on besides kdbkit's
own kernels (``test_code_object_checks.py``); this file makes sure it stays complete: a macro
added to the dialect later fails here until the kernel uses it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.errors import CompilerUnavailableError
from kdbkit.runtime.kernel_sources import KernelSearchPath, kernels_dir
from tests.runtime.conftest import compile_file

DIALECT_DIR = Path(__file__).parent / "kernels"
DIALECT_KERNEL = "dialect_everything.c"
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(KDB_\w+)", re.MULTILINE)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def dialect_macros() -> set[str]:
    """Every ``KDB_`` macro kdb_compat.h defines, less its include guard and the ``KDB_BACKEND_*`` markers."""
    names = set(_DEFINE.findall((kernels_dir() / "kdb_compat.h").read_text()))
    return {n for n in names if n != "KDB_COMPAT_H" and not n.startswith("KDB_BACKEND_")}


def test_the_header_parses_to_the_documented_vocabulary():
    macros = dialect_macros()
    axes = {f"KDB_{what}_{axis}" for what in ("LOCAL_ID", "GROUP_ID", "LOCAL_SIZE", "NUM_GROUPS", "GLOBAL_ID")
            for axis in "XYZ"}  # fmt: skip
    math = {f"KDB_{f}" for f in ("EXPF", "SQRTF", "FMAXF", "FMINF", "FABSF", "FMAF")}
    rest = {"KDB_KERNEL", "KDB_DEVICE_FN", "KDB_GLOBAL", "KDB_RESTRICT", "KDB_SHARED", "KDB_LOCAL", "KDB_BARRIER"}
    assert macros >= axes | math | rest, "the parser misses macros the header documents"


def test_the_dialect_kernel_uses_every_macro():
    code = _COMMENT.sub(" ", (DIALECT_DIR / DIALECT_KERNEL).read_text())  # a mention in a comment is no use
    used = set(re.findall(r"\bKDB_\w+\b", code))
    missing = sorted(dialect_macros() - used)
    assert not missing, f"{DIALECT_KERNEL} does not use {', '.join(missing)}: add them to it"


def test_the_dialect_kernel_compiles_with_nvrtc():
    from kdbkit.runtime.compilers import NvrtcCompiler

    try:
        cubin = compile_file(Target.parse("sm_90"), DIALECT_KERNEL, compiler=NvrtcCompiler(),
                             search_path=KernelSearchPath([DIALECT_DIR]))
    except CompilerUnavailableError as e:
        pytest.skip(f"NVRTC is not installed ({e.problem}): pip install 'kdbkit[cuda]'")
    assert cubin[:4] == b"\x7fELF"


def test_the_dialect_kernel_compiles_as_opencl_c():
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install 'kdbkit[opencl]')")
    from kdbkit.runtime.backends import opencl

    devices = opencl.discover()
    if not devices:
        pytest.skip("no OpenCL device (install the CPU device: pip install 'kdbkit[opencl]')")
    binary = compile_file(devices[0].target, DIALECT_KERNEL, search_path=KernelSearchPath([DIALECT_DIR]))
    assert binary
