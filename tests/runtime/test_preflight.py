"""Preflight: a package or bundle whose binaries the driver cannot load is refused before it
runs, with the reason and the fix; what cannot be judged is let through (the load is the last check)."""

from __future__ import annotations

import json

import pytest

from kdbkit.kdb import Target, write_bundle
from kdbkit.packager.select import choose, scan
from kdbkit.packager.wheel import write_package
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.kernel_sources import source_digest
from kdbkit.runtime.preflight import DeviceRuntime, code_object_refusal, refusal, runtime_of
from kdbkit.runtime.system_bundles import bundle_for_device
from kdbkit.runtime.paths import SearchDir
from tests.runtime.amd_bundles import amd_bundle
from tests.runtime.chain_fixtures import isolated  # noqa: F401

SM90 = Target("cuda", "sm_90", (), 132)
CUDA_12_4 = DeviceRuntime("cuda", (12, 4))
GFX942_304 = Target.parse("gfx942_304")


def hip(major: int, minor: int) -> DeviceRuntime:
    return DeviceRuntime("hip", (major, minor))


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


# ---------------------------------------------------------------- AMD code object versions


@pytest.mark.parametrize("version, runtime, needs", [
    (4, hip(4, 0), "ROCm 4.1"),  # ROCm 4.0's loader took v2 and v3 only
    (4, hip(4, 1), None),
    (5, hip(5, 1), "ROCm 5.2"),
    (5, hip(5, 2), None),
    (5, hip(7, 0), None),  # no release has dropped an older version
    (6, hip(6, 1), "ROCm 6.2"),
    (6, hip(6, 2), None),
    (3, hip(4, 0), None),  # older than the table: not judged
    (7, hip(6, 2), None),  # a version the table does not know: not judged
    (5, DeviceRuntime("hip", None), None),  # a runtime that did not say its version: never refused
    (5, CUDA_12_4, None),  # not an AMD device
    (None, hip(5, 1), None),  # binaries whose version is not known
])
def test_a_code_object_newer_than_the_rocm_loader_is_refused_with_the_release_it_needs(version, runtime, needs):
    why = code_object_refusal(version, runtime)
    if needs is None:
        assert why == ""
    else:
        assert why.startswith(f"holds AMD code object v{version}, which needs {needs} or newer to load; "
                              f"this one supports {runtime}: update ROCm to {needs[5:]} or newer")


def test_the_remedy_names_the_newest_version_this_rocm_loads():
    assert code_object_refusal(6, hip(6, 1)).endswith("or install a package of code object v5 or older")
    assert code_object_refusal(6, hip(5, 1)).endswith("or install a package of code object v4 or older")
    assert code_object_refusal(4, hip(4, 0)).endswith("update ROCm to 4.1 or newer")  # none older in the table


def test_the_compilers_rule_comes_first_then_the_code_objects():
    assert refusal("hiprtc 7.0", hip(6, 1), code_objects=6).startswith("built with hiprtc 7.0")
    assert refusal("clang 19.1.7", hip(6, 1), code_objects=6).startswith("holds AMD code object v6")
    assert refusal("clang 19.1.7", DeviceRuntime("hip", None), code_objects=6) == ""


def test_the_runtime_passes_over_an_amd_bundle_whose_code_objects_its_rocm_cannot_load(tmp_path):
    v5, v6 = amd_bundle(tmp_path / "v5", 5), amd_bundle(tmp_path / "v6", 6)  # real clang-19 code objects
    for bundle, too_old, new_enough in ((v5, hip(5, 1), hip(5, 2)), (v6, hip(6, 1), hip(6, 2))):
        dirs = [SearchDir(bundle.parent, "test")]
        used, trace = bundle_for_device(GFX942_304, "hsaco", dirs, too_old)
        (rejected,) = [c for c in trace if c.status == "rejected"]
        needed = f"{new_enough.version[0]}.{new_enough.version[1]}"
        assert used is None and rejected.path == bundle
        assert rejected.reason.startswith(f"holds AMD code object v{bundle.parent.name[1]}, which needs ROCm {needed} "
                                          f"or newer to load; this one supports {too_old}")
        for loads in (new_enough, DeviceRuntime("hip", None)):  # new enough, or a runtime that did not say
            used, _ = bundle_for_device(GFX942_304, "hsaco", dirs, loads)
            assert used is not None and used.path == bundle
    # Both installed, v6 first: ROCm 6.1 passes over it to the v5 one
    used, trace = bundle_for_device(GFX942_304, "hsaco", [SearchDir(v6.parent, "a"), SearchDir(v5.parent, "b")],
                                    hip(6, 1))
    assert used.path == v5 and [(c.path, c.status) for c in trace if c.status != "missing"] == [
        (v6, "rejected"), (v5, "accepted")]


def test_kdb_doctor_and_devices_say_which_amd_bundle_this_rocm_cannot_load(tmp_path, kdb, monkeypatch, isolated):
    from kdbkit.runtime.backends import registry

    bundle = amd_bundle(tmp_path / "installed", 6)
    mi300x = DeviceInfo("hip", 0, "AMD Instinct MI300X", GFX942_304, 192 << 30)  # its runtime: KDB_DEVICE_RUNTIME
    monkeypatch.setattr(registry, "DISCOVERERS", {"cuda": list, "hip": lambda: [mi300x], "opencl": list})
    monkeypatch.delenv("KDB_BACKEND", raising=False)
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(bundle.parent))
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "HIP 6.1")
    _, out, _ = kdb("doctor", "--json")
    rows = {r["item"]: r for r in json.loads(out) if r["section"] == "devices"}
    assert rows["#0"]["value"] == ("hip AMD Instinct MI300X: gfx942_304 (HIP 6.1); missing gfx942.kdb "
                                   "(JIT and user cache only)")
    assert rows["#0 not used"]["ok"] is False
    assert rows["#0 not used"]["value"] == (f"{bundle}: holds AMD code object v6, which needs ROCm 6.2 or newer to "
                                            "load; this one supports HIP 6.1: update ROCm to 6.2 or newer, or install "
                                            "a package of code object v5 or older")
    code, out, _ = kdb("devices", "--json")
    (device,) = json.loads(out)
    assert code == 0 and device["bundle"] is None
    assert [(r["path"], r["reason"]) for r in device["rejected"]] == [(str(bundle), rows["#0 not used"]["value"]
                                                                       .removeprefix(f"{bundle}: "))]
    monkeypatch.setenv("KDB_DEVICE_RUNTIME", "HIP 6.2")
    _, out, _ = kdb("doctor", "--json")
    rows = {r["item"]: r for r in json.loads(out) if r["section"] == "devices"}
    assert rows["#0"]["value"] == f"hip AMD Instinct MI300X: gfx942_304 (HIP 6.2); uses {bundle}"
    assert "#0 not used" not in rows
