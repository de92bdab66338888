"""The AMD matrix-core convolution (conv_igemm_mfma.hip), built offline by clang-19: the MFMA
instructions are in the code objects for gfx90a and gfx942 (by disassembly), none elsewhere,
and its solver says where it applies. Untested on hardware: no AMD GPU here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kdbkit.kdb import Target
from kdbkit.packager.code_object_checks import check_code_object
from kdbkit.runtime.compilers import AmdgcnClangCompiler
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType
from tests.prerequisites import require_amdgcn_clang, skip_or_fail
from tests.runtime.conftest import compile_file

# The instruction as llvm-objdump-19 names it on each target (gfx942's spelling has underscores).
MFMA = {("gfx90a", "fp16"): "v_mfma_f32_32x32x8f16", ("gfx90a", "bf16"): "v_mfma_f32_32x32x8bf16_1k",
        ("gfx942", "fp16"): "v_mfma_f32_32x32x8_f16", ("gfx942", "bf16"): "v_mfma_f32_32x32x8_bf16"}


def _disassemble(blob: bytes, tmp_path: Path) -> str:
    objdump = shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")
    if objdump is None:
        skip_or_fail("amdgcn-clang", "llvm-objdump is not installed (apt-get install llvm-19)")
    path = tmp_path / "kernel.co"
    path.write_bytes(blob)
    return subprocess.run([objdump, "-d", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx1100"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_matrix_instructions_are_in_the_code_object(arch, dtype, tmp_path):
    require_amdgcn_clang()
    blob = compile_file(Target.parse(arch), "conv_igemm_mfma.hip", *DataType.parse(dtype).options,
                        compiler=AmdgcnClangCompiler())
    assert check_code_object(blob, arch) == []
    text = _disassemble(blob, tmp_path)
    assert "conv_igemm_mfma_fwd_nhwc" in text
    if arch == "gfx1100":  # RDNA has no MFMA: the kernel is empty there
        assert "v_mfma" not in text
    else:
        assert MFMA[arch, dtype] in text


def test_the_solver_applies_on_mfma_gpus_only():
    solver = REGISTRY.find("ConvImplicitGemmMfma")

    def verdict(arch="gfx942", backend="hip", direction="F", dtype=DataType.FP16, layout="NHWC", groups=1):
        device = SimpleNamespace(backend=backend, target=Target.parse(arch))
        return solver.is_applicable(ConvProblem(direction, dtype, layout, (2, 8, 9, 9), 8, (3, 3), (1, 1),
                                                groups=groups), device)

    assert verdict() and verdict(arch="gfx90a") and verdict(arch="gfx90a:xnack-", dtype=DataType.BF16)
    assert "MFMA 32x32x8" in verdict(arch="gfx1100").reason and "MFMA" in verdict(backend="cuda", arch="sm_90").reason
    assert "fp32 is not" in verdict(dtype=DataType.FP32).reason
    assert "forward direction only" in verdict(direction="B").reason
    assert "NHWC" in verdict(layout="NCHW").reason and "one group" in verdict(groups=2).reason
