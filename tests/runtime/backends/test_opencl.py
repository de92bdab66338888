"""The OpenCL compiler and backend end to end on the local OpenCL device (PoCL on the CPU), against NumPy.

Each kernel variant is compiled once per module (a PoCL build takes about a second).
"""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.runtime.backends.opencl import ENVELOPE_MAGIC, unwrap_binary, wrap_binary
from kdbkit.runtime.errors import BinaryLoadError, CompileError, CompilerUnavailableError, LaunchArgumentError, TransferError

from ..conftest import build, compile_file, compile_text


@pytest.fixture(scope="module")
def activation(opencl_backend):
    return build(opencl_backend, "activation.c")


@pytest.fixture(scope="module")
def reduce_sum(opencl_backend):
    return build(opencl_backend, "reduce_sum.c", "-DBLOCK=128")


@pytest.fixture(scope="module")
def sgemm16(opencl_backend):
    return build(opencl_backend, "matmul_tiled.c", "-DTILE=16")


@pytest.fixture(scope="module")
def activation_binary(opencl_backend):
    return compile_file(opencl_backend.device.target, "activation.c")


@pytest.mark.parametrize("n, grid", [(1, 1), (1000, 16), (4099, 3)])  # grid * 64 < n exercises the grid-stride loop
def test_activation(opencl_backend, activation, kernel_checks, n, grid):
    kernel_checks.activation(opencl_backend, activation, n, grid=grid)


def test_activation_in_double(opencl_backend, kernel_checks):
    module = build(opencl_backend, "activation.c", "-DKDB_DTYPE=double")
    kernel_checks.activation(opencl_backend, module, 777, grid=4, dtype=np.float64)


@pytest.mark.parametrize("n", [1, 128, 1000, 100_003])
def test_reduce_sum(opencl_backend, reduce_sum, kernel_checks, n):
    kernel_checks.reduce_sum(opencl_backend, reduce_sum, n, block=128, groups=5)


@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (37, 45, 29), (64, 33, 100), (1, 70, 3)])
def test_sgemm_tile16(opencl_backend, sgemm16, kernel_checks, m, n, k):
    kernel_checks.sgemm(opencl_backend, sgemm16, m, n, k, tile=16)


def test_sgemm_tile8_with_alpha_beta(opencl_backend, kernel_checks):
    module = build(opencl_backend, "matmul_tiled.c", "-DTILE=8")
    kernel_checks.sgemm(opencl_backend, module, 21, 19, 23, tile=8, alpha=0.5, beta=2.0)


def test_binary_is_enveloped_and_round_trips(opencl_backend, activation_binary):
    assert activation_binary.startswith(ENVELOPE_MAGIC)
    payload = unwrap_binary(activation_binary, opencl_backend._arch, "test")
    assert wrap_binary(opencl_backend._arch, payload) == activation_binary
    assert opencl_backend.load(activation_binary).function("relu_fwd").name == "relu_fwd"


@pytest.mark.parametrize(
    "mangle, match",
    [
        (lambda b: b"garbage" * 20, "not a kdbkit OpenCL binary"),
        (lambda b: b"", "not a kdbkit OpenCL binary"),
        (lambda b: b[64:], "not a kdbkit OpenCL binary"),  # the driver's bare binary
        (lambda b: b[:200], "corrupt or truncated"),  # PoCL itself segfaults on this one
        (lambda b: b[:-1], "corrupt or truncated"),
        (lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:], "corrupt or truncated"),
    ],
)
def test_bad_binaries_are_refused_not_crashed_on(opencl_backend, activation_binary, mangle, match):
    with pytest.raises(BinaryLoadError, match=match):
        opencl_backend.load(mangle(activation_binary))


def test_binary_of_another_device_is_refused(opencl_backend, activation_binary):
    payload = unwrap_binary(activation_binary, opencl_backend._arch, "test")
    foreign = wrap_binary("ocl-0123456789ab", payload)
    with pytest.raises(BinaryLoadError, match="built for ocl-0123456789ab.*rebuild it on this machine"):
        opencl_backend.load(foreign)


def test_missing_kernel_name_is_a_load_error(activation):
    with pytest.raises(BinaryLoadError, match="no kernel 'softmax'.*relu_fwd"):
        activation.function("softmax")


def test_compile_error_carries_the_log(opencl_backend):
    source = '#include "kdb_compat.h"\nKDB_KERNEL void broken(KDB_GLOBAL float* x) { x[0] = not_declared; }\n'
    with pytest.raises(CompileError, match="broken.c failed to compile on .*not_declared") as info:
        compile_text(opencl_backend.device.target, source, name="broken.c")
    assert "not_declared" in info.value.log and "\n" not in info.value.problem


def test_kernel_folder_with_blanks_compiles(opencl_backend, tmp_path, kernel_checks):
    # The compiler gets the includes inlined, so no folder is ever passed to PoCL (which splits -I on blanks).
    from kdbkit.runtime.kernel_sources import KernelSearchPath, kernels_dir

    spaced = tmp_path / "kernel sources"
    spaced.mkdir()
    (spaced / "mine.c").write_text((kernels_dir() / "activation.c").read_text())
    binary = compile_file(opencl_backend.device.target, "mine.c", search_path=KernelSearchPath([spaced]))
    kernel_checks.activation(opencl_backend, opencl_backend.load(binary), 100, grid=2)


def test_the_opencl_compiler_needs_no_backend_and_names_its_device(opencl_backend):
    from kdbkit.kdb import Target
    from kdbkit.runtime.compilers import compiler_for

    compiler = compiler_for(opencl_backend.device.target)
    assert compiler.identity() and compiler.identity() == compiler.identity()
    with pytest.raises(CompilerUnavailableError, match="no local OpenCL device is ocl-0123456789ab"):
        compiler_for(Target("opencl", "ocl-0123456789ab"))


def test_plain_python_numbers_are_refused(opencl_backend, activation):
    buf = opencl_backend.alloc(16)
    with pytest.raises(LaunchArgumentError, match=r"argument 2 is int 4.*np\.int32"):
        opencl_backend.launch(activation.function("relu_fwd"), (1, 1, 1), (4, 1, 1), [buf, buf, 4])
    buf.free()
    with pytest.raises(LaunchArgumentError, match="already freed"):
        opencl_backend.launch(activation.function("relu_fwd"), (1, 1, 1), (4, 1, 1), [buf, buf, np.int32(4)])


def test_to_host_refuses_an_output_larger_than_the_buffer(opencl_backend):
    buf = opencl_backend.to_device(np.arange(4, dtype=np.float32))
    with pytest.raises(TransferError, match="16"):
        opencl_backend.to_host(buf, np.empty(8, np.float32))
    np.testing.assert_array_equal(opencl_backend.to_host(buf, np.empty(4, np.float32)), np.arange(4))


def test_timing_and_identity(opencl_backend, sgemm16):
    m = n = k = 64
    a = opencl_backend.to_device(np.ones((m, k), np.float32))
    c = opencl_backend.alloc(m * n * 4)
    args = [a, a, c, np.int32(m), np.int32(n), np.int32(k), np.float32(1), np.float32(0)]
    kernel = sgemm16.function("sgemm_tiled")
    ms = opencl_backend.time_ms(lambda: opencl_backend.launch(kernel, (4, 4, 1), (16, 16, 1), args), repeat=3)
    assert ms > 0
    opencl_backend.synchronize()
