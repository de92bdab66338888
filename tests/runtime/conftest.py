"""Fixtures for backend tests: one opened backend per vendor, and the kernel checks they share.

The same end-to-end checks (real kernels from ``kernels/`` against NumPy) run on every
backend; a backend whose device is absent is skipped with the reason, never an error.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from kdbkit.kdb import Target
from kdbkit.runtime.backends.base import Backend, Module
from kdbkit.runtime.compilers import Compiler, compiler_for
from kdbkit.runtime.kernel_sources import KernelSearchPath
from kdbkit.runtime.program_key import ProgramRequest

# The lookup-chain tests' fixtures live in their own module; importing them here registers them.
from tests.runtime.chain_fixtures import (  # noqa: F401
    isolated,
    make_handle,
    chain_backend,
    chain_device,
    private_kernels,
)


@pytest.fixture(scope="session")
def opencl_backend() -> Backend:
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install 'kdbkit[opencl]')")
    from kdbkit.runtime.backends import opencl
    from kdbkit.runtime.backends.registry import default_device

    devices = opencl.discover()
    if not devices:
        pytest.skip("no OpenCL device (install the CPU device: pip install 'kdbkit[opencl]')")
    return opencl.OpenCLBackend(default_device(devices))


@pytest.fixture(scope="session")
def cuda_backend() -> Backend:
    from kdbkit.runtime.backends import cuda

    devices = cuda.discover()
    if not devices:
        pytest.skip("no CUDA device: needs an NVIDIA GPU, its driver and cuda-bindings")
    return cuda.CudaBackend(devices[0])


def compile_file(target: Target, source: str, *options: str, compiler: Compiler | None = None,
                 search_path: KernelSearchPath | None = None) -> bytes:
    """Compile kernel ``source`` (on the default search path) with ``options`` for ``target``."""
    compiler = compiler or compiler_for(target)
    read = (search_path or KernelSearchPath()).read(source)
    return compiler.compile(ProgramRequest(source, options), target, read)


def compile_text(target: Target, text: str, *options: str, name: str = "k.c", compiler: Compiler | None = None) -> bytes:
    """Compile a kernel given as text (it may include kdb_compat.h) for ``target``."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / name).write_text(text)
        return compile_file(target, name, *options, compiler=compiler, search_path=KernelSearchPath([folder]))


def build(backend: Backend, source: str, *options: str) -> Module:
    """Compile kernel ``source`` with ``options`` for ``backend``'s device and load the binary."""
    return backend.load(compile_file(backend.device.target, source, *options))


class KernelChecks:
    """End-to-end checks of the sample kernels, for any backend; each returns nothing or fails."""

    @staticmethod
    def activation(backend: Backend, module: Module, n: int, *, grid: int, block: int = 64, dtype=np.float32) -> None:
        rng = np.random.default_rng(n)
        x = rng.standard_normal(n).astype(dtype)
        dx, dy = backend.to_device(x), backend.alloc(x.nbytes)
        backend.launch(module.function("relu_fwd"), (grid, 1, 1), (block, 1, 1), [dx, dy, np.int32(n)])
        np.testing.assert_array_equal(backend.to_host(dy, np.empty_like(x)), np.maximum(x, 0))
        alpha = np.float32(0.125)
        backend.launch(module.function("leaky_relu_fwd"), (grid, 1, 1), (block, 1, 1), [dx, dy, np.int32(n), alpha])
        expected = np.where(x > 0, x, x * dtype(alpha))
        np.testing.assert_allclose(backend.to_host(dy, np.empty_like(x)), expected, rtol=0, atol=0)
        dx.free()
        dy.free()

    @staticmethod
    def reduce_sum(backend: Backend, module: Module, n: int, *, block: int = 256, groups: int = 8) -> None:
        """Two passes: ``groups`` partial sums, then one block sums the partials."""
        x = np.random.default_rng(n).random(n, dtype=np.float32)
        dx, dpartial, dtotal = backend.to_device(x), backend.alloc(groups * 4), backend.alloc(4)
        kernel = module.function("reduce_sum")
        backend.launch(kernel, (groups, 1, 1), (block, 1, 1), [dx, dpartial, np.int32(n)])
        backend.launch(kernel, (1, 1, 1), (block, 1, 1), [dpartial, dtotal, np.int32(groups)])
        total = backend.to_host(dtotal, np.empty(1, np.float32))[0]
        np.testing.assert_allclose(total, x.astype(np.float64).sum(), rtol=1e-5)
        for buf in (dx, dpartial, dtotal):
            buf.free()

    @staticmethod
    def sgemm(backend: Backend, module: Module, m: int, n: int, k: int, *, tile: int, alpha=1.0, beta=0.0) -> None:
        rng = np.random.default_rng(m * 10_000 + n * 100 + k)
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = rng.standard_normal((m, n), dtype=np.float32)
        da, db, dc = backend.to_device(a), backend.to_device(b), backend.to_device(c)
        grid = ((n + tile - 1) // tile, (m + tile - 1) // tile, 1)
        args = [da, db, dc, np.int32(m), np.int32(n), np.int32(k), np.float32(alpha), np.float32(beta)]
        backend.launch(module.function("sgemm_tiled"), grid, (tile, tile, 1), args)
        expected = alpha * (a.astype(np.float64) @ b) + beta * c
        np.testing.assert_allclose(backend.to_host(dc, np.empty_like(c)), expected, rtol=1e-4, atol=1e-4)
        for buf in (da, db, dc):
            buf.free()


@pytest.fixture(scope="session")
def kernel_checks() -> type[KernelChecks]:
    return KernelChecks
