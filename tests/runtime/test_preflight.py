"""Preflight: a package or bundle whose binaries the driver cannot load is refused before it
runs, with the reason and the fix; what cannot be judged is let through (the load is the last check)."""

from __future__ import annotations

import pytest

from kdbkit.kdb import Target, write_bundle
from kdbkit.packager.select import choose, scan
from kdbkit.packager.wheel import write_package
from kdbkit.runtime.kernel_sources import source_digest
from kdbkit.runtime.preflight import DeviceRuntime, refusal, runtime_of
from kdbkit.runtime.system_bundles import bundle_for_device
from kdbkit.runtime.paths import SearchDir

SM90 = Target("cuda", "sm_90", (), 132)
CUDA_12_4 = DeviceRuntime("cuda", (12, 4))


@pytest.mark.parametrize("compiler, runtime, refused", [
    ("nvrtc 13.0", CUDA_12_4, True),  # a newer major: the driver cannot load its cubins
    ("nvrtc 12.8 + cuda-headers 12.8", CUDA_12_4, False),  # CUDA's minor-version compatibility
    ("nvrtc 13.0", DeviceRuntime("cuda", (13, 0)), False),
    ("nvrtc 13.0", DeviceRuntime("cuda", None), False),  # a driver that did not say: not judged
    ("hiprtc 7.0", DeviceRuntime("hip", (6, 2)), True),
    ("clang 19.1.7 amdgcn", DeviceRuntime("hip", (6, 2)), False),
    ("pocl 3.1 llvm 15.0.6", DeviceRuntime("opencl", None), False),  # the ocl arch names the driver already
])
def test_a_compiler_newer_than_the_driver_is_refused_with_the_fix(compiler, runtime, refused):
    why = refusal(compiler, runtime)
    assert bool(why) == refused
    if refused:
        assert "update" in why and "or install a package built with" in why


def test_kdb_device_runtime_stands_for_another_machines_driver(monkeypatch):
    assert runtime_of("cuda", "CUDA 13.0") == DeviceRuntime("cuda", (13, 0))
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "CUDA 12.4")
    assert runtime_of("cuda", "CUDA 13.0") == CUDA_12_4
    assert runtime_of("hip", "") == DeviceRuntime("hip", None)  # a CUDA version says nothing of HIP
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "twelve")
    assert runtime_of("cuda", "CUDA 13.0") == DeviceRuntime("cuda", (13, 0))


def _bundles(folder, *compilers):
    made = []
    for i, compiler in enumerate(compilers):
        sub = folder / f"b{i}"
        sub.mkdir(parents=True)
        made.append(write_bundle(sub / SM90.arch_wide().bundle_name(), SM90.arch_wide(),
                                 [("softmax.c", "-DX", bytes(range(256)) * 8)], compiler=compiler,
                                 binary_format="cubin", sources={"softmax.c": source_digest("softmax.c")}))
    return made


def test_install_chooses_the_package_this_driver_loads_and_says_why_not_the_other(tmp_path):
    newer, older = _bundles(tmp_path / "bundles", "nvrtc 13.0", "nvrtc 12.8")
    wheels = tmp_path / "wheels"
    write_package(newer, wheels)  # this kdbkit's version
    write_package(older, wheels, version="0.2.0.dev1")  # an older one, also for this kdbkit
    choice = choose(SM90, scan(wheels), runtime=CUDA_12_4)
    assert choice.chosen is not None and choice.chosen.compiler == "nvrtc 12.8"
    (reason,) = [why for c, why in choice.rejected if c.compiler == "nvrtc 13.0"]
    assert "built with NVRTC 13.0" in reason and "CUDA 12.4" in reason
    assert choose(SM90, scan(wheels)).chosen.compiler == "nvrtc 13.0"  # without a driver to ask: the newer


def test_kdb_install_check_refuses_a_package_built_for_a_newer_driver(tmp_path, kdb, monkeypatch):
    (newer,) = _bundles(tmp_path / "bundles", "nvrtc 13.0")
    write_package(newer, tmp_path / "wheels")
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "CUDA 12.4")
    code, out, err = kdb("install", "--from", tmp_path / "wheels", "--target", "sm_90_132", "--check")
    assert code == 1 and "built with NVRTC 13.0" in out + err and "Traceback" not in err
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "CUDA 13.0")
    code, out, err = kdb("install", "--from", tmp_path / "wheels", "--target", "sm_90_132", "--check")
    assert code == 0, out + err


def test_the_runtime_passes_over_an_installed_bundle_its_driver_cannot_load(tmp_path):
    (newer,) = _bundles(tmp_path / "db", "nvrtc 13.0")
    dirs = [SearchDir(newer.parent, "test")]
    used, trace = bundle_for_device(SM90, "cubin", dirs, CUDA_12_4)
    (rejected,) = [c for c in trace if c.status == "rejected"]
    assert used is None and rejected.path == newer and "built with NVRTC 13.0" in rejected.reason
    used, _ = bundle_for_device(SM90, "cubin", dirs, DeviceRuntime("cuda", (13, 1)))
    assert used is not None and used.path == newer
