"""Build targets: --target and --gpu, the table of known GPUs, and what the installed
compilers build (NVRTC's supported archs, clang's amdgcn processors), on a machine with no GPU."""

from __future__ import annotations

import pytest

from kdbkit.kdb.errors import BundleNameError
from kdbkit.kdb.target import Target
from kdbkit.packager.targets import KNOWN_GPUS, find_gpu, resolve_targets
from kdbkit.packager.errors import TargetError

from tests.prerequisites import require_amdgcn_clang, require_nvrtc


@pytest.fixture
def compilers():
    """NVRTC (the CUDA extra) and clang-19 for amdgcn, which CI installs."""
    require_amdgcn_clang()
    require_nvrtc()


def test_a_gpu_name_gives_its_arch_and_compute_units():
    assert str(find_gpu("MI300X").target) == "gfx942_304"
    assert str(find_gpu("mi250x").target) == "gfx90a_110"  # one of its two devices
    assert str(find_gpu("h100 sxm").target) == str(find_gpu("H100").target) == "sm_90_132"
    assert str(find_gpu("H100_PCIe").target) == "sm_90_114"
    assert len({g.name for g in KNOWN_GPUS}) == len(KNOWN_GPUS)
    with pytest.raises(TargetError, match="unknown GPU 'MI400X'") as exc:
        find_gpu("MI400X")
    assert "did you mean MI300X" in exc.value.remedy and "kdb targets" in exc.value.remedy


def test_targets_and_gpus_resolve_once_each_in_order(compilers):
    found = resolve_targets(["gfx90a_110", "gfx942_304", "sm_90_132", "sm_80_108", "gfx942"], ["H100-SXM", "MI210"])
    assert [str(t) for t in found] == ["gfx90a_110", "gfx942_304", "sm_90_132", "sm_80_108", "gfx942", "gfx90a_104"]
    assert found[4] == Target("hip", "gfx942")  # arch-wide: no compute-unit count


@pytest.mark.parametrize("target, builds", [("sm_99_10", "sm_75, sm_80"), ("gfx999", "gfx90a"), ("sm_70", "sm_75")])
def test_an_arch_no_compiler_builds_lists_what_they_do(compilers, target, builds):
    with pytest.raises(TargetError, match=f"does not build {target.split('_1')[0]}") as exc:
        resolve_targets([target])
    assert builds in exc.value.remedy


def test_arch_specific_and_family_targets_build_where_their_arch_does(compilers):
    """sm_90a (wgmma's) and sm_120f are targets NVRTC builds; the builder compared them with
    NVRTC's plain list (sm_90, ...) and refused them. A suffix the arch has no variant for is refused."""
    found = resolve_targets(["sm_90a_132", "sm_100a", "sm_120f_170", "gfx942:xnack-_304"])
    assert [str(t) for t in found] == ["sm_90a_132", "sm_100a", "sm_120f_170", "gfx942:xnack-_304"]
    with pytest.raises(TargetError, match="sm_89 has no 'a' variant") as exc:
        resolve_targets(["sm_89a"])
    assert exc.value.remedy == "build sm_89"


def test_malformed_or_missing_targets_are_clear_errors():
    with pytest.raises(BundleNameError, match="malformed target 'sm90'"):
        resolve_targets(["sm90"])
    with pytest.raises(TargetError, match="no target to build for"):
        resolve_targets()
