"""The HIP backend without AMD hardware: lazy imports, arch strings, and offline amdgcn code objects.

With clang-19 (or another clang with the amdgcn target) on PATH, every sample kernel is built
for gfx942 in HIP mode with no ROCm at all, and the code object's target is read back.
"""

from __future__ import annotations

import importlib.abc
import struct
import sys

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends import hip
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.backends.elf_notes import EM_AMDGPU, TargetStringError, amdgpu_target, read_elf_header
from kdbkit.runtime.compilers.amdgcn_clang import AmdgcnClangCompiler, clang_identity, compile_amdgcn
from kdbkit.runtime.errors import BackendUnavailableError, BinaryLoadError, CompileError, CompilerUnavailableError
from kdbkit.runtime.kernel_sources import list_sources

from tests.prerequisites import require_amdgcn_clang
from ..conftest import compile_file, compile_text


def _code_object(source: str, arch: str, *options: str) -> bytes:
    return compile_file(Target.parse(arch), source, *options, compiler=AmdgcnClangCompiler())

needs_clang = pytest.mark.usefixtures("amdgcn_clang")  # skips without clang-19 (fails in CI)
MI300X = Target("hip", "gfx942", ("sramecc+", "xnack-"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gfx90a:sramecc+:xnack-", ("gfx90a", ("sramecc+", "xnack-"))),
        ("gfx942:xnack-:sramecc+", ("gfx942", ("sramecc+", "xnack-"))),
        (b"gfx1100\0\0\0\0", ("gfx1100", ())),
        ("gfx90a:xnack+", ("gfx90a", ("xnack+",))),
    ],
)
def test_gcn_arch_name_parsing(text, expected):
    assert hip.parse_gcn_arch_name(text) == expected


@pytest.mark.parametrize("text", ["sm_90", "gfx", "gfx90a:xnack", "gfx90a:xnack?", "gfxZZ"])
def test_malformed_gcn_arch_names_are_refused(text):
    with pytest.raises(TargetStringError):
        hip.parse_gcn_arch_name(text)


class _RaisingFinder(importlib.abc.MetaPathFinder):
    """Makes ``import hip`` / ``import amdsmi`` fail as they do on a machine without ROCm."""

    def find_spec(self, name, path=None, target=None):
        if name == "amdsmi":
            raise KeyError("ROCM_PATH")  # what amdsmi really raises where ROCm is absent
        if name == "hip" or name.startswith("hip."):
            raise ImportError("libamdhip64.so: cannot open shared object file")
        return None


@pytest.fixture
def no_rocm(monkeypatch):
    for name in [m for m in sys.modules if m in ("hip", "amdsmi") or m.startswith("hip.")]:
        monkeypatch.delitem(sys.modules, name)
    finder = _RaisingFinder()
    sys.meta_path.insert(0, finder)
    yield
    sys.meta_path.remove(finder)


def test_without_rocm_there_are_no_hip_devices_and_no_error(no_rocm):
    assert hip.discover() == []
    assert hip._driver_version(object()) == ""  # amdsmi's KeyError is swallowed too


def test_opening_a_hip_device_without_hip_python_says_what_to_install(no_rocm):
    device = DeviceInfo("hip", 0, "AMD Instinct MI300X", Target("hip", "gfx942", (), 304), 192 << 30)
    with pytest.raises(BackendUnavailableError, match=r"hip-python is not available.*kdbkit\[hip\]"):
        hip.HipBackend(device)


def test_a_non_hip_device_is_refused():
    device = DeviceInfo("cuda", 0, "H100", Target("cuda", "sm_90", (), 132), 1)
    with pytest.raises(BackendUnavailableError, match="not a HIP one"):
        hip.HipBackend(device)


def _elf_with_flags(e_flags: int, machine: int = EM_AMDGPU) -> bytes:
    """A bare 64-bit ELF header (no sections, so no notes)."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, 0, e_flags, 64, 0, 0, 64, 0, 0)


@pytest.mark.parametrize(
    "e_flags, expected",
    [
        (0x63F, ("gfx90a", ("xnack-",))),  # sramecc any, xnack off
        (0x54C, ("gfx942", ())),  # both "any": no requirement
        (0xF4C, ("gfx942", ("sramecc+", "xnack+"))),
        (0x041, ("gfx1100", ())),  # features unsupported
    ],
)
def test_target_from_e_flags_when_there_is_no_note(e_flags, expected):
    assert amdgpu_target(_elf_with_flags(e_flags)) == expected


def test_unknown_mach_without_note_is_refused():
    with pytest.raises(BinaryLoadError, match="unknown EF_AMDGPU_MACH 0x7f"):
        amdgpu_target(_elf_with_flags(0x7F))


@pytest.mark.parametrize(
    "binary, match",
    [(b"\x7fELF-not-really", "not an ELF file"), (_elf_with_flags(0x5A04, machine=190), "machine 190, not an AMD GPU")],
)
def test_code_object_check_refuses_non_amd_binaries(binary, match):
    with pytest.raises(BinaryLoadError, match=match):
        hip.check_code_object(binary, MI300X, "MI300X")


# ---------------------------------------------------------------- offline builds with clang


@pytest.fixture(scope="module")
def gfx942_objects() -> dict[str, bytes]:
    require_amdgcn_clang()
    return {src: _code_object(src, "gfx942") for src in list_sources()}


@needs_clang
def test_every_kernel_compiles_offline_for_gfx942(gfx942_objects):
    assert set(gfx942_objects) >= {"activation.c", "reduce_sum.c", "matmul_tiled.c"}
    for source, blob in gfx942_objects.items():
        header = read_elf_header(blob)
        assert header.e_machine == EM_AMDGPU == 224, source
        assert amdgpu_target(blob) == ("gfx942", ()), source


@needs_clang
def test_offline_kernel_names_are_not_mangled(gfx942_objects):
    blob = gfx942_objects["matmul_tiled.c"]
    assert b"\0sgemm_tiled\0" in blob and b"sgemm_tiled.kd" in blob
    assert b"_Z11sgemm_tiled" not in blob


@needs_clang
def test_target_features_reach_the_code_object_and_the_check():
    blob = _code_object("activation.c", "gfx90a:xnack-")
    assert amdgpu_target(blob) == ("gfx90a", ("xnack-",))
    ok = hip.check_code_object(blob, Target("hip", "gfx90a", ("sramecc+", "xnack-")), "MI210")
    assert ok.full_arch == "gfx90a:xnack-"
    with pytest.raises(BinaryLoadError, match="MI210 is gfx90a:sramecc\\+:xnack\\+ .*built for gfx90a:xnack-"):
        hip.check_code_object(blob, Target("hip", "gfx90a", ("sramecc+", "xnack+")), "MI210")


@needs_clang
def test_code_object_for_another_processor_is_refused(gfx942_objects):
    assert hip.check_code_object(gfx942_objects["reduce_sum.c"], MI300X, "MI300X").arch == "gfx942"
    with pytest.raises(BinaryLoadError, match="MI210 is gfx90a.*built for gfx942 \\(arch gfx942 != gfx90a\\)"):
        hip.check_code_object(gfx942_objects["reduce_sum.c"], Target("hip", "gfx90a"), "MI210")


@needs_clang
def test_tile_size_option_reaches_the_compiler():
    small = _code_object("matmul_tiled.c", "gfx942", "-DTILE=8")
    # Two TILE*TILE float tiles of LDS: 512 bytes for TILE=8 (2048 for the default 16).
    assert b"group_segment_fixed_size" in small and small != _code_object("matmul_tiled.c", "gfx942", "-DTILE=16")


@needs_clang
def test_offline_compile_error_carries_clang_diagnostics():
    source = '#include "kdb_compat.h"\nKDB_KERNEL void broken(float* x) { x[0] = not_declared; }\n'
    with pytest.raises(CompileError, match="broken.c failed to compile for gfx942.*not_declared") as info:
        compile_text(Target("hip", "gfx942"), source, name="broken.c", compiler=AmdgcnClangCompiler())
    assert "broken.c:2:" in info.value.log  # the #line markers point at the real file and line


@needs_clang
def test_clang_identity_and_bad_targets():
    assert clang_identity().startswith("clang ")
    with pytest.raises(CompilerUnavailableError, match="not an AMD GPU target"):
        compile_amdgcn("", "sm_90")
