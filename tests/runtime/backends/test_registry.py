"""Device discovery: order, KDB_BACKEND, the KDB_DEVICE_* overrides, default_device, no import side effects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends import registry
from kdbkit.runtime.backends.base import BackendUnavailableError, DeviceInfo
from kdbkit.runtime.backends.opencl import opencl_arch, opencl_compiler_identity
from kdbkit.runtime.backends.registry import Overrides, apply_overrides, default_device, discover_devices, selected_backends

REPO = Path(__file__).resolve().parents[3]

H100 = DeviceInfo("cuda", 0, "NVIDIA H100 80GB HBM3", Target("cuda", "sm_90", (), 132), 80 << 30, "580.65")
MI210 = DeviceInfo("hip", 0, "AMD Instinct MI210", Target("hip", "gfx90a", ("sramecc+", "xnack-"), 104), 64 << 30)
POCL = DeviceInfo("opencl", 0, "pthread-AMD EPYC", Target("opencl", "ocl-0123456789ab", (), 16), 32 << 30)


@pytest.fixture
def fake_vendors(monkeypatch):
    """Replace the vendor discoverers with fixed lists, in an order different from the result's."""
    found = {"opencl": [POCL], "hip": [MI210], "cuda": [H100]}
    monkeypatch.setattr(registry, "DISCOVERERS", {b: (lambda b=b: list(found[b])) for b in ("cuda", "hip", "opencl")})
    for var in ("KDB_BACKEND", "KDB_DEVICE_ARCH", "KDB_DEVICE_CU"):
        monkeypatch.delenv(var, raising=False)
    return found


def test_order_is_cuda_then_hip_then_opencl(fake_vendors):
    assert [d.backend for d in discover_devices()] == ["cuda", "hip", "opencl"]


@pytest.mark.parametrize(
    "value, expected",
    [("opencl", ["opencl"]), ("HIP", ["hip"]), ("opencl,cuda", ["cuda", "opencl"]), ("", ["cuda", "hip", "opencl"])],
)
def test_kdb_backend_restricts_discovery(fake_vendors, monkeypatch, value, expected):
    monkeypatch.setenv("KDB_BACKEND", value)
    assert [d.backend for d in discover_devices()] == expected


def test_unknown_kdb_backend_warns_with_the_choices_and_allows_all(fake_vendors, monkeypatch, fresh_log, capsys):
    monkeypatch.setenv("KDB_BACKEND", "metal")
    assert selected_backends() == ("cuda", "hip", "opencl")
    assert [d.backend for d in discover_devices()] == ["cuda", "hip", "opencl"]
    err = capsys.readouterr().err.splitlines()
    assert err == ["kdbkit warning: KDB_BACKEND='metal' is not understood (accepted: cuda, hip, opencl, "
                   "comma-separated); using the default (unset)"]


def _overrides(arch=None, cu=None):
    target = Target.parse(arch) if arch else None
    return Overrides(target, cu if cu is not None else (target.cu if target else None))


def test_arch_override_applies_to_its_backend_only():
    devices = apply_overrides([H100, MI210, POCL], _overrides("gfx90a:xnack+"))
    assert devices[0] == H100 and devices[2] == POCL
    assert str(devices[1].target) == "gfx90a:xnack+_104"


def test_arch_override_may_carry_a_cu_count_and_cu_override_wins():
    (dev,) = apply_overrides([MI210], _overrides("gfx942_304"))
    assert str(dev.target) == "gfx942_304"
    (dev,) = apply_overrides([MI210], _overrides("gfx942_304", 228))
    assert str(dev.target) == "gfx942_228"


def test_cu_override_alone_applies_to_every_device():
    devices = apply_overrides([H100, MI210, POCL], _overrides(cu=60))
    assert [d.target.cu for d in devices] == [60, 60, 60]
    assert [d.target.arch for d in devices] == ["sm_90", "gfx90a", "ocl-0123456789ab"]


def test_overrides_apply_to_opencl_devices(fake_vendors, monkeypatch):
    monkeypatch.setenv("KDB_DEVICE_ARCH", "ocl-00000000abcd")
    monkeypatch.setenv("KDB_DEVICE_CU", "7")
    # The arch names one backend: only the OpenCL device takes it, and the CU count with it.
    assert discover_devices() == [H100, MI210, POCL.__class__(**{**POCL.__dict__,
                                                                  "target": Target.parse("ocl-00000000abcd_7")})]


def test_an_arch_override_that_reaches_no_device_says_so(fake_vendors, monkeypatch, fresh_log, capsys):
    fake_vendors["cuda"].clear()
    fake_vendors["hip"].clear()
    monkeypatch.setenv("KDB_DEVICE_ARCH", "gfx90a")
    monkeypatch.setenv("KDB_DEVICE_CU", "110")
    assert discover_devices() == [POCL]  # nothing changed, and the user is told why
    (line,) = capsys.readouterr().err.splitlines()
    assert "KDB_DEVICE_ARCH=gfx90a names a hip arch but the devices here are opencl: it changes nothing" in line


@pytest.mark.parametrize(
    "variable, value, accepted",
    [
        ("KDB_DEVICE_ARCH", "vega", "a target such as gfx90a"),
        ("KDB_DEVICE_CU", "lots", "an integer from 1 up"),
        ("KDB_DEVICE_CU", "0", "an integer from 1 up"),
    ],
)
def test_malformed_overrides_warn_once_and_are_ignored(fake_vendors, monkeypatch, fresh_log, capsys, variable,
                                                         value, accepted):
    monkeypatch.setenv(variable, value)
    assert discover_devices()[0] == H100
    discover_devices()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kdbkit warning: {variable}={value!r} is not understood (accepted: {accepted}")


def test_overrides_are_read_at_discovery_time(fake_vendors, monkeypatch):
    monkeypatch.setenv("KDB_DEVICE_ARCH", "sm_80")
    monkeypatch.setenv("KDB_DEVICE_CU", "108")
    assert str(discover_devices()[0].target) == "sm_80_108"
    monkeypatch.delenv("KDB_DEVICE_ARCH")
    monkeypatch.delenv("KDB_DEVICE_CU")
    assert str(discover_devices()[0].target) == "sm_90_132"


def test_default_device_prefers_a_gpu_then_opencl():
    assert default_device([POCL, MI210]) == MI210
    assert default_device([POCL]) == POCL


def test_no_device_at_all_says_how_to_get_one(fake_vendors):
    for found in fake_vendors.values():
        found.clear()
    with pytest.raises(BackendUnavailableError, match=r"no GPU and no OpenCL device found.*pip install 'kdbkit\[opencl\]'"):
        default_device()


def test_a_kdb_backend_that_hides_every_device_says_so(fake_vendors, monkeypatch):
    fake_vendors["cuda"].clear()
    monkeypatch.setenv("KDB_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match=r"no cuda device found; KDB_BACKEND=cuda hides 2 hip, opencl "
                                                       r"device\(s\); unset KDB_BACKEND or add hip, opencl to it"):
        default_device()


def test_open_backend_refuses_an_unknown_backend():
    fake = DeviceInfo.__new__(DeviceInfo)
    object.__setattr__(fake, "backend", "metal")
    object.__setattr__(fake, "name", "Apple M3")
    with pytest.raises(BackendUnavailableError, match="unknown backend 'metal'"):
        registry.open_backend(fake)


def test_importing_the_backends_loads_no_vendor_library():
    code = (
        "import sys, kdbkit, kdbkit.runtime.backends, kdbkit.runtime.backends.cuda, kdbkit.runtime.backends.hip\n"
        "import kdbkit.runtime.backends.opencl, kdbkit.runtime.compilers, kdbkit.runtime.handle\n"
        "vendor = ['pyopencl', 'cuda.bindings.driver', 'cuda.bindings.nvrtc', 'hip', 'amdsmi', 'pynvml']\n"
        "print(','.join(m for m in vendor if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_real_discovery_gives_valid_targets():
    for dev in discover_devices():
        assert dev.target.backend == dev.backend
        assert dev.target.cu and dev.target.cu > 0
        assert dev.memory_bytes > 0 and dev.name


def test_opencl_arch_is_a_hash_of_the_four_facts():
    facts = ("Portable Computing Language", "OpenCL 3.0 PoCL 3.1", "pthread-AMD EPYC", "3.1")
    arch = opencl_arch(*facts)
    assert arch.startswith("ocl-") and len(arch) == 16
    assert Target.parse(arch).backend == "opencl"
    assert opencl_arch(*facts) == arch
    for i in range(4):
        changed = list(facts)
        changed[i] += "x"
        assert opencl_arch(*changed) != arch
    # Length-prefixed fields: moving text across a field boundary changes the hash.
    assert opencl_arch("ab", "c", "d", "e") != opencl_arch("a", "bc", "d", "e")


def test_opencl_compiler_identity_names_pocl_and_its_llvm():
    version = "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release, RELOC, LLVM 14.0.6, SLEEF, DISTRO, POCL_DEBUG"
    assert opencl_compiler_identity("Portable Computing Language", version, "3.0-rc2") == "pocl 3.0-rc2 llvm 14.0.6"
    assert opencl_compiler_identity("NVIDIA CUDA", "OpenCL 3.0 CUDA 13.0.48", "580.65") == "NVIDIA CUDA 580.65"
