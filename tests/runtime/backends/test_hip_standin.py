"""kdbkit's HIP path through the real hip-python, against a stand-in HIP runtime, per release line.

No AMD GPU is needed: ``tests/hip_standin`` builds ``libamdhip64.so`` and ``libhiprtc.so``
that record every call, check pointers, handles and each launch's argument buffer against the
code object's metadata, and compile with a real clang. Each hip-python line listed in
``tests/hip_standin/hip_python_lines.txt`` (installed by ``scripts/install_hip_python_lines.sh``)
runs the same scenarios in a child process. What this cannot show: that kernels compute the
right values on AMD hardware (the stand-in runs no kernel), ROCm's own hiprtc headers, and
real streams and timing.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kdbkit.runtime.compilers.amdgcn_clang import find_clang
from tests.hip_standin import build_standin, hip_python_folder, hip_python_lines, run_scenario, skip_or_fail

LINES = hip_python_lines()


@pytest.fixture(scope="session")
def standin_lib(tmp_path_factory):
    return build_standin(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module", params=LINES, ids=[f"hip-python-{v}" for v in LINES])
def line(request):
    folder = hip_python_folder(request.param)
    if folder is None:
        skip_or_fail(f"hip-python {request.param} is not installed for the stand-in tests: run "
                     "scripts/install_hip_python_lines.sh")
    if find_clang() is None:
        skip_or_fail("no clang with the amdgcn target on PATH (apt-get install clang-19 lld-19)")
    return request.param, folder


class _Runs:
    """Each scenario runs once per line, on first use, and is shared by the tests that read it."""

    def __init__(self, line, standin_lib, tmp_path_factory):
        self.line, self.folder = line
        self.lib = standin_lib
        self.tmp = tmp_path_factory
        self._done = {}

    def __call__(self, scenario: str, **kwargs):
        key = (scenario, tuple(sorted((kwargs.get("env") or {}).items())), kwargs.get("with_standin", True))
        if key not in self._done:
            work = kwargs.pop("work", None) or self.tmp.mktemp(f"{self.line}-{scenario}")
            self._done[key] = run_scenario(scenario, line_folder=self.folder, standin_lib=self.lib, work=work,
                                           **kwargs)
        return self._done[key]


@pytest.fixture(scope="module")
def runs(line, standin_lib, tmp_path_factory):
    return _Runs(line, standin_lib, tmp_path_factory)


# ---------------------------------------------------------------- discovery


def test_discovery_reads_every_device_through_this_binding(runs):
    two = "gfx942:sramecc+:xnack-,304,206141652992,AMD Instinct MI300X;gfx90a:sramecc+:xnack-,104,68702699520,AMD Instinct MI210"
    run = runs("discover", env={"KDB_STANDIN_DEVICES": two})
    assert run.result["devices"] == [
        {"index": 0, "name": "AMD Instinct MI300X", "target": "gfx942:sramecc+:xnack-", "cu": 304,
         "memory": 206141652992, "driver": "HIP 60443483", "runtime": "HIP 6.4"},
        {"index": 1, "name": "AMD Instinct MI210", "target": "gfx90a:sramecc+:xnack-", "cu": 104,
         "memory": 68702699520, "driver": "HIP 60443483", "runtime": "HIP 6.4"},
    ]  # the runtime from hipRuntimeGetVersion's 60443483: ROCm 6.4, which preflight judges code objects against
    # The stand-in fills hipDeviceProp_tR0600 as ROCm 6+ lays it out; the binding reads the same size.
    assert {c["struct_bytes"] for c in run.named("hipGetDeviceProperties")} == {run.result["props_bytes"]} == {1472}
    assert run.result["binding"].startswith(f"hip-python {runs.line}")
    assert run.problems == []


def test_without_rocm_the_backend_is_unavailable_not_a_bare_runtime_error(runs):
    r = runs("no_rocm", with_standin=False).result
    assert r["devices"] == []
    assert r["backend"]["type"] == "BackendUnavailableError"
    assert "cannot load ROCm" in r["backend"]["problem"] and "ROCM_PATH" in r["backend"]["remedy"]
    assert r["hiprtc"]["type"] == "CompilerUnavailableError"


# ---------------------------------------------------------------- load, launch, copy, close


def test_a_launch_packs_each_argument_where_the_code_object_says(runs):
    run = runs("backend")
    r = run.result
    launches = run.named("hipModuleLaunchKernel")
    first = launches[0]
    assert first["result"] == 0 and first["kernel"] == "leaky_relu_fwd"
    assert first["grid"] == [4, 1, 1] and first["block"] == [256, 1, 1]
    args = first["args"]
    assert [(a["offset"], a["size"], a["kind"]) for a in args] == [
        (0, 8, "global_buffer"), (8, 8, "global_buffer"), (16, 4, "by_value"), (20, 4, "by_value")]
    values = [bytes.fromhex(a["hex"]) for a in args]
    assert struct.unpack("<Q", values[0])[0] == r["x_ptr"]
    assert struct.unpack("<Q", values[1])[0] == r["y_ptr"]
    assert struct.unpack("<i", values[2])[0] == 1000
    assert struct.unpack("<f", values[3])[0] == 0.5
    assert first["buffer_bytes"] >= 24
    assert run.problems == [], run.problems


def test_copies_and_events_go_through_the_runtime(runs):
    run = runs("backend")
    assert run.result["round_trip_equal"] is True
    kinds = [(c["kind"], c["bytes"]) for c in run.named("hipMemcpy")]
    assert (1, 4000) in kinds and (2, 4000) in kinds  # HostToDevice, DeviceToHost
    assert run.result["time_ms"] >= 0
    assert [c["call"] for c in run.calls if c["call"].startswith("hipEvent")].count("hipEventDestroy") == 2


def test_the_module_keeps_the_image_bytes_the_runtime_was_given(runs):
    run = runs("backend")
    loads = [c for c in run.named("hipModuleLoadData") if c["result"] == 0]
    assert loads[0]["image"] == run.result["module_image_address"]
    assert run.result["module_image_is_loaded_bytes"] is True
    assert loads[0]["version"] == [1, 2]  # code object v5


def test_close_unloads_modules_and_frees_buffers(runs):
    run = runs("backend")
    assert run.result["live_before_close"]["modules"] == 1
    assert run.result["live_before_close"]["allocations"] == 2
    assert run.result["live_after_close"] == {"allocations": 0, "modules": 0, "events": 0}
    assert len([c for c in run.named("hipModuleUnload") if c["result"] == 0]) == 1
    assert run.result["after_close"]["type"] == "DeviceCallError"


def test_a_module_nobody_holds_is_unloaded_when_collected(runs):
    run = runs("module_lifetime")
    assert run.result == {"modules_while_kernel_held": 1, "modules_after_release": 0}
    assert run.problems == []


def test_long_double_is_refused_before_the_launch(runs):
    r = runs("backend").result["long_double"]
    assert r["type"] == "LaunchArgumentError"
    assert "long double is 8 bytes on AMD GPUs" in r["problem"] and "np.float64" in r["remedy"]


@pytest.mark.parametrize("mistake, words", [
    ("missing_argument", "leaky_relu_fwd takes 4 arguments (pointer, pointer, 4-byte value, 4-byte value), got 3"),
    ("wrong_width", "argument 2 is int64 (8 bytes), but the kernel takes a 4-byte value there"),
    ("buffer_for_value", "argument 2 is a device buffer, but the kernel takes a 4-byte value there"),
    ("value_for_pointer", "argument 1 is int64 (8 bytes), but the kernel takes a pointer there"),
])
def test_arguments_that_do_not_match_the_code_objects_parameters_never_reach_the_runtime(runs, mistake, words):
    run = runs("backend")
    r = run.result[mistake]
    assert r["type"] == "LaunchArgumentError" and words in r["problem"], r
    assert len(run.named("hipModuleLaunchKernel")) == 3  # the first launch and the two timed ones only


def test_missing_kernels_and_wrong_processors_are_clear_errors(runs):
    r = runs("backend").result
    assert r["missing_kernel"]["type"] == "BinaryLoadError" and "no_such_kernel" in r["missing_kernel"]["problem"]
    assert r["wrong_arch"]["type"] == "BinaryLoadError"
    assert "built for gfx90a" in r["wrong_arch"]["problem"]


@pytest.mark.parametrize("call, error, words", [
    ("hipMalloc", "DeviceCallError", "hipMalloc failed (hipErrorOutOfMemory)"),
    ("hipModuleLoadData", "BinaryLoadError", "refused a gfx942 code object: hipModuleLoadData failed"),
    ("hipModuleLaunchKernel", "LaunchError", "hipModuleLaunchKernel(relu_fwd"),
    ("hipMemcpy", "TransferError", "hipMemcpy(HostToDevice) failed"),
])
def test_a_failing_call_is_the_kdbkit_error_for_it(runs, call, error, words):
    r = runs("failures").result[call]
    assert r is not None, f"{call} was asked to fail but kdbkit raised nothing"
    assert r["type"] == error and words in r["problem"]


# ---------------------------------------------------------------- hiprtc


def test_hiprtc_compiles_and_destroys_each_program(runs):
    run = runs("hiprtc")
    r = run.result
    assert r["identity"] == "hiprtc 6.4"
    assert r["target"] == ["gfx90a", ["xnack-"]]
    assert r["live_programs_after_compile"] == 0
    options = run.named("hiprtcCompileProgram")[0]["options"]
    assert options == ["--offload-arch=gfx90a:xnack-", "-O3", "-DKDB_DTYPE=float"]
    kdbkit_destroys = run.named("hiprtcDestroyProgram")[:2]
    assert [c["result"] for c in kdbkit_destroys] == [0, 0]  # the good compile, then the broken one


def test_a_compile_error_carries_the_compilers_log_and_leaks_nothing(runs):
    r = runs("hiprtc").result
    assert r["broken"]["type"] == "CompileError"
    assert "broken.c failed to compile for gfx942 with hiprtc" in r["broken"]["problem"]
    assert "not_declared" in r["broken"]["log"]
    assert r["live_programs_after_error"] == 0


def test_the_standin_catches_a_handle_passed_where_its_address_belongs(runs):
    """What kdbkit did before: the stand-in refuses it (ROCm would free a bogus pointer)."""
    run = runs("hiprtc")
    assert run.result["destroy_handle_itself"] == 3  # HIPRTC_ERROR_INVALID_INPUT
    assert run.result["destroy_reference"] == 0
    assert run.result["live_programs_at_end"] == 0
    assert [p["call"] for p in run.problems] == ["hiprtcDestroyProgram"]


# ---------------------------------------------------------------- the whole chain


def test_the_chain_jits_with_hiprtc_then_a_new_process_reads_the_user_cache(runs, tmp_path):
    first = runs("handle", work=tmp_path)
    assert first.result["source"] == "jit" and first.result["compiler"] == "hiprtc 6.4"
    assert first.result["device"] == "AMD Instinct MI300X"
    assert len(first.named("hiprtcCompileProgram")) == 1
    assert first.named("hipModuleLaunchKernel")[0]["result"] == 0
    second = run_scenario("handle", line_folder=runs.folder, standin_lib=runs.lib, work=tmp_path)
    assert second.result["source"] == "user"
    assert second.named("hiprtcCompileProgram") == []
    assert first.problems == second.problems == []


# ---------------------------------------------------------------- what is declared is what is tested


def test_the_declared_hip_python_range_is_the_tested_one():
    import tomllib

    from packaging.specifiers import SpecifierSet

    from kdbkit.runtime.backends.hip_binding import SUPPORTED_RANGE
    from tests.hip_standin import REPO

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hip"]
    assert f"hip-python{SUPPORTED_RANGE}" in extra
    spec = SpecifierSet(SUPPORTED_RANGE)
    assert all(f"{line}.0" in spec for line in LINES)
    majors = {int(line.split(".")[0]) for line in LINES}
    assert majors == {6, 7, 10}  # every major line hip-python has published in the range
    assert min(LINES, key=lambda v: tuple(map(int, v.split(".")))) == "6.2"  # the range's floor is tested
