"""The CUDA backend and NVRTC: cubins and the cubin arch check need no GPU; the rest runs on one.

Tests marked ``gpu`` run the sample kernels through NVRTC and the driver on the first CUDA
device and are skipped, with the reason, where there is none.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kdbkit.kdb import Target
from kdbkit.runtime.backends import cuda
from kdbkit.runtime.backends.elf_notes import EM_CUDA, ElfHeader, cubin_arch, cubin_sm, read_elf_header
from kdbkit.runtime.errors import BinaryLoadError, CompileError, CompilerUnavailableError, LaunchArgumentError
from kdbkit.runtime.kernel_sources import list_sources

from ..conftest import build, compile_file, compile_text

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed (pip install 'kdbkit[cuda]')")
from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler, compile_cuda, cuda_headers, nvrtc_identity  # noqa: E402


def _cubin(source: str, arch: str, *options: str) -> bytes:
    return compile_file(Target("cuda", arch), source, *options, compiler=NvrtcCompiler())


@pytest.fixture(scope="module")
def activation_sm80() -> bytes:
    return _cubin("activation.c", "sm_80")


@pytest.mark.parametrize("source", ["activation.c", "reduce_sum.c", "matmul_tiled.c"])
def test_every_kernel_compiles_to_an_sm90_cubin_without_a_gpu(source):
    cubin = _cubin(source, "sm_90", "-DTILE=16")
    header = read_elf_header(cubin)
    assert cubin[:4] == b"\x7fELF" and header.elf_class == 2
    assert header.e_machine == EM_CUDA == 190
    assert cubin_arch(cubin) == "sm_90"


def test_kernel_names_are_not_mangled():
    cubin = _cubin("activation.c", "sm_90")
    assert b"\0relu_fwd\0" in cubin and b"\0leaky_relu_fwd\0" in cubin
    assert b"_Z8relu_fwd" not in cubin


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_cubin_arch_reads_back_what_was_compiled(arch):
    assert cubin_arch(_cubin("reduce_sum.c", arch)) == arch


def test_abi7_cubins_keep_the_sm_in_the_low_byte():
    # e_flags of an sm_70 cubin from CUDA 11/12 (ABI version 7): SM 70 in bits 0-7 and the
    # virtual arch in bits 16-23.
    assert cubin_sm(ElfHeader(2, 0x33, 7, 2, EM_CUDA, 0x00460546)) == 70
    assert cubin_sm(ElfHeader(2, 0x41, 8, 2, EM_CUDA, 0x06005A04)) == 90


def test_header_from_the_wheel_is_found_for_fp16():
    folder, identity = cuda_headers()
    assert (folder / "cuda_fp16.h").is_file()
    assert identity.startswith("cuda headers 1") and str(folder) not in identity  # content, not place
    source = '#include <cuda_fp16.h>\n#include "kdb_compat.h"\nKDB_KERNEL void h(__half* x) { x[0] = __float2half(1.0f); }\n'
    assert cubin_arch(compile_text(Target("cuda", "sm_90"), source, name="half.cu")) == "sm_90"


def _fake_entry(root, version=13050, bf16=b"// bf16\n"):
    include = root / "nvidia" / "cu13" / "include"
    include.mkdir(parents=True)
    (include / "cuda_runtime_api.h").write_bytes(b"// api\n#define CUDART_VERSION  %d\n" % version)
    (include / "cuda_fp16.h").write_bytes(b"// fp16\n")
    (include / "cuda_bf16.hpp").write_bytes(bf16)
    return root


@pytest.mark.parametrize("change", [dict(version=13060), dict(bf16=b"// bf16, patched\n")])
def test_the_header_identity_follows_what_the_headers_hold_not_where(monkeypatch, tmp_path, change):
    from kdbkit.runtime.compilers import nvrtc as nvrtc_module

    def identity(entry):
        monkeypatch.setattr(nvrtc_module, "_nvidia_entries", lambda: (str(entry),))
        nvrtc_module.cuda_headers.cache_clear()
        try:
            return nvrtc_module.cuda_headers()[1]
        finally:
            nvrtc_module.cuda_headers.cache_clear()

    here = identity(_fake_entry(tmp_path / "a"))
    assert here.startswith("cuda headers 13.5 #")
    assert identity(_fake_entry(tmp_path / "another machine")) == here
    assert identity(_fake_entry(tmp_path / "b", **change)) != here


def test_the_header_folder_is_part_of_the_compiler_identity(monkeypatch):
    from kdbkit.runtime.compilers import nvrtc as nvrtc_module

    folder, identity = cuda_headers()
    before = NvrtcCompiler().identity()
    assert before.startswith("nvrtc ") and before.endswith(identity)
    monkeypatch.setattr(nvrtc_module, "cuda_headers", lambda: (folder, "cuda-runtime headers 99.0.0"))
    assert NvrtcCompiler().identity() != before  # other headers: another key for every program


def test_compile_error_carries_nvrtc_log():
    source = '#include "kdb_compat.h"\nKDB_KERNEL void broken(float* x) { x[0] = not_declared; }\n'
    with pytest.raises(CompileError, match="broken.cu failed to compile for sm_90 with nvrtc: .*not_declared") as info:
        compile_text(Target("cuda", "sm_90"), source, name="broken.cu")
    assert '"not_declared" is undefined' in info.value.log and "broken.cu(2)" in info.value.log
    assert "\n" not in info.value.problem  # one line; the log is apart


@pytest.mark.parametrize("arch", ["compute_90", "sm90", "gfx942"])
def test_only_cubin_arches_are_accepted(arch):
    with pytest.raises(CompilerUnavailableError, match="expected sm_<NN>"):
        compile_cuda("", arch)


def test_nvrtc_identity():
    major, minor = nvrtc.nvrtcVersion()[1:]
    assert nvrtc_identity().startswith(f"nvrtc {major}.{minor}")


def test_cubin_check_accepts_the_same_arch(activation_sm80):
    assert cuda.check_cubin(activation_sm80, "sm_80", "A100") == "sm_80"


@pytest.mark.parametrize(
    "binary, match",
    [
        (b"garbage" * 20, "not an ELF file"),
        (b"//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90\n" + b" " * 64, "not an ELF file"),
        (b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 1, 62) + bytes(44), "machine 62, not a CUDA cubin"),
    ],
)
def test_cubin_check_refuses_what_is_not_a_cubin(binary, match):
    with pytest.raises(BinaryLoadError, match=match):
        cuda.check_cubin(binary, "sm_90", "H100")


def test_cubin_check_refuses_another_arch(activation_sm80):
    with pytest.raises(BinaryLoadError, match="H100 is sm_90 but this cubin was built for sm_80.*rebuild it for sm_90"):
        cuda.check_cubin(activation_sm80, "sm_90", "H100")


def test_discovery_never_raises():
    for dev in cuda.discover():
        assert dev.backend == "cuda" and dev.target.arch.startswith("sm_") and dev.target.cu > 0


# ---------------------------------------------------------------- on a CUDA GPU


@pytest.fixture(scope="module")
def gpu_modules(cuda_backend):
    return {
        "activation": build(cuda_backend, "activation.c"),
        "reduce": build(cuda_backend, "reduce_sum.c", "-DBLOCK=256"),
        "sgemm": build(cuda_backend, "matmul_tiled.c", "-DTILE=16"),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("n, grid", [(1, 1), (1000, 16), (100_003, 7)])
def test_gpu_activation(cuda_backend, gpu_modules, kernel_checks, n, grid):
    kernel_checks.activation(cuda_backend, gpu_modules["activation"], n, grid=grid)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 1000, 1_000_003])
def test_gpu_reduce_sum(cuda_backend, gpu_modules, kernel_checks, n):
    kernel_checks.reduce_sum(cuda_backend, gpu_modules["reduce"], n, block=256, groups=64)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (37, 45, 29), (300, 129, 77)])
def test_gpu_sgemm(cuda_backend, gpu_modules, kernel_checks, m, n, k):
    kernel_checks.sgemm(cuda_backend, gpu_modules["sgemm"], m, n, k, tile=16, alpha=1.5, beta=0.5)


@pytest.mark.gpu
def test_gpu_refuses_a_cubin_for_another_arch(cuda_backend):
    other = "sm_80" if cuda_backend.hardware_arch != "sm_80" else "sm_90"
    cuda_backend.load(_cubin("activation.c", cuda_backend.hardware_arch))  # accepted headers are remembered...
    with pytest.raises(BinaryLoadError, match=f"built for {other}"):
        cuda_backend.load(_cubin("activation.c", other))
    with pytest.raises(BinaryLoadError, match="no kernel 'nope'"):
        gpu_modules_activation = build(cuda_backend, "activation.c")
        gpu_modules_activation.function("nope")


@pytest.mark.gpu
def test_gpu_timing_and_every_sample_compiles(cuda_backend, gpu_modules):
    for source in list_sources():
        build(cuda_backend, source)
    x = cuda_backend.to_device(np.ones(1 << 20, np.float32))
    kernel = gpu_modules["activation"].function("relu_fwd")
    ms = cuda_backend.time_ms(lambda: cuda_backend.launch(kernel, (256, 1, 1), (256, 1, 1), [x, x, np.int32(1 << 20)]), repeat=5)
    assert ms > 0
    cuda_backend.synchronize()


@pytest.mark.gpu
def test_gpu_closing_a_handle_releases_the_cuda_context(cuda_backend):
    # In a fresh process: this one's session backend keeps the primary context alive.
    import subprocess
    import sys

    code = (
        "from cuda.bindings import driver\n"
        "from kdbkit.runtime.handle import Handle\n"
        "from kdbkit.runtime.backends.registry import discover_devices\n"
        "device = next(d for d in discover_devices() if d.backend == 'cuda')\n"
        "def active():\n"
        "    err, dev = driver.cuDeviceGet(device.index)\n"
        "    return driver.cuDevicePrimaryCtxGetState(dev)[2]\n"
        "with Handle(device) as h:\n"
        "    h.program('activation.c', '-DKDB_DTYPE=float')\n"
        "    inside = active()\n"
        "print(inside, active())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "0"]


@pytest.mark.gpu
def test_gpu_a_launcher_takes_new_buffers_each_run_and_refuses_freed_ones(cuda_backend, gpu_modules):
    """Backend.launcher packs the fixed arguments once; each run writes only the buffers' addresses."""
    from kdbkit.runtime.errors import LaunchArgumentError

    kernel = gpu_modules["activation"].function("leaky_relu_fwd")
    run = cuda_backend.launcher(kernel, (4, 1, 1), (256, 1, 1), [None, None, np.int32(1000), np.float32(0.25)])
    rng = np.random.default_rng(5)
    for _ in range(3):
        host = rng.standard_normal(1000).astype(np.float32)
        x, y = cuda_backend.to_device(host), cuda_backend.alloc(4000)
        run(x, y)
        out = cuda_backend.to_host(y, np.empty(1000, np.float32))
        np.testing.assert_array_equal(out, np.where(host > 0, host, np.float32(0.25) * host))
        x.free()
        with pytest.raises(LaunchArgumentError, match="already freed"):
            run(x, y)
        y.free()


@pytest.mark.gpu
def test_gpu_a_struct_passed_by_value_reaches_the_kernel(cuda_backend):
    """A 128-byte, 64-byte-aligned struct (a tensor map's shape) between scalars and buffers,
    through launch and through a launcher: every word arrives, and the arguments after it too."""
    from kdbkit.runtime.backends.args import ParamBlock

    text = """
    struct __align__(64) Block { unsigned long long word[16]; };
    extern "C" __global__ void echo(int first, const __grid_constant__ Block block, unsigned long long* out, int last)
    {
        const int i = threadIdx.x;
        if (i < 16) out[i] = block.word[i] + (unsigned long long)first;
        if (i == 16) out[16] = (unsigned long long)last;
    }
    """
    module = cuda_backend.load(compile_text(cuda_backend.device.target, text, name="echo.cu"))
    words = np.arange(1, 17, dtype=np.uint64) * np.uint64(0x0101_0101_0101)
    block = ParamBlock(words.tobytes(), 64)
    out = cuda_backend.alloc(17 * 8)
    cuda_backend.launch(module.function("echo"), (1, 1, 1), (32, 1, 1), [np.int32(5), block, out, np.int32(-3)])
    got = cuda_backend.to_host(out, np.empty(17, np.uint64))
    np.testing.assert_array_equal(got[:16], words + np.uint64(5))
    assert got[16] == np.uint64(2**64 - 3)
    run = cuda_backend.launcher(module.function("echo"), (1, 1, 1), (32, 1, 1), [np.int32(7), block, None, np.int32(9)])
    run(out)
    got = cuda_backend.to_host(out, np.empty(17, np.uint64))
    np.testing.assert_array_equal(got[:16], words + np.uint64(7))
    assert got[16] == 9
    # Rebound to other blocks: its slots copied (wherever the copy's alignment falls), the
    # blocks replaced, the scalars and the run-time buffer's slot as they were; the first launch
    # keeps its own block.
    other = cuda_backend.alloc(17 * 8)
    for k in range(1, 5):
        again = run.rebound(ParamBlock((words * np.uint64(k + 1)).tobytes(), 64))
        again(other)
        got = cuda_backend.to_host(other, np.empty(17, np.uint64))
        np.testing.assert_array_equal(got[:16], words * np.uint64(k + 1) + np.uint64(7))
        assert got[16] == 9
    run(out)
    np.testing.assert_array_equal(cuda_backend.to_host(out, np.empty(17, np.uint64))[:16], words + np.uint64(7))
    with pytest.raises(LaunchArgumentError, match="parameter blocks"):
        run.rebound(ParamBlock(words[:8].tobytes(), 64))  # a block of another size
    with pytest.raises(LaunchArgumentError, match="parameter blocks"):
        run.rebound(block, block)
    other.free()
    out.free()
