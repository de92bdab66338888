"""The sample kernels: how to launch each one and check it against NumPy.

Used by the main job (``kdb demo``), by ``scripts/bench_startup.py`` and by the tests, so
that every one of them exercises the same real kernels end to end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kdbkit.runtime.handle import Handle
from kdbkit.runtime.program import Program


@dataclass(frozen=True)
class Sample:
    name: str
    kernel_file: str
    options: tuple[str, ...]
    run: Callable[[Handle, Program, np.random.Generator], float]  # returns the relative error


@dataclass
class SampleResult:
    name: str
    kernel_file: str
    options: tuple[str, ...]
    source: str
    resolve_ms: float
    run_ms: float
    rel_error: float
    ok: bool
    steps: list


def _rel_error(got: np.ndarray, want: np.ndarray) -> float:
    if not np.all(np.isfinite(got)):
        return float("inf")
    denom = float(np.linalg.norm(want.astype(np.float64))) or 1.0
    return float(np.linalg.norm(got.astype(np.float64) - want.astype(np.float64))) / denom


def _poisoned(shape, dtype=np.float32) -> np.ndarray:
    return np.full(shape, np.nan, dtype=dtype)  # unwritten outputs show up as NaN


def _run_relu(handle: Handle, program: Program, rng: np.random.Generator) -> float:
    be, n = handle.backend, 100_003
    x = rng.standard_normal(n).astype(np.float32)
    dx, dy = be.to_device(x), be.to_device(_poisoned(n))
    be.launch(program.function("relu_fwd"), (64, 1, 1), (256, 1, 1), [dx, dy, np.int32(n)])
    y = be.to_host(dy, np.empty(n, np.float32))
    return _rel_error(y, np.maximum(x, 0))


def _run_reduce(handle: Handle, program: Program, rng: np.random.Generator) -> float:
    be, n, block, groups = handle.backend, 1_000_037, 256, 120
    x = rng.standard_normal(n).astype(np.float32)
    dx, dp, dt = be.to_device(x), be.to_device(_poisoned(groups)), be.to_device(_poisoned(1))
    fn = program.function("reduce_sum")
    be.launch(fn, (groups, 1, 1), (block, 1, 1), [dx, dp, np.int32(n)])
    be.launch(fn, (1, 1, 1), (block, 1, 1), [dp, dt, np.int32(groups)])
    total = be.to_host(dt, np.empty(1, np.float32))
    want = np.array([x.astype(np.float64).sum()])
    # a sum's relative error is measured against the sum of magnitudes, its conditioning
    return float(abs(total[0] - want[0]) / np.abs(x.astype(np.float64)).sum())


def _run_sgemm(handle: Handle, program: Program, rng: np.random.Generator) -> float:
    be, (m, n, k), tile = handle.backend, (100, 70, 130), 16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    da, db, dc = be.to_device(a), be.to_device(b), be.to_device(_poisoned((m, n)))
    grid = ((n + tile - 1) // tile, (m + tile - 1) // tile, 1)
    be.launch(program.function("sgemm_tiled"), grid, (tile, tile, 1),
              [da, db, dc, np.int32(m), np.int32(n), np.int32(k), np.float32(1.0), np.float32(0.0)])
    c = be.to_host(dc, np.empty((m, n), np.float32))
    return _rel_error(c, a.astype(np.float64) @ b.astype(np.float64))


SAMPLES = (
    Sample("relu", "activation.c", ("-DKDB_DTYPE=float",), _run_relu),
    Sample("reduce_sum", "reduce_sum.c", ("-DBLOCK=256",), _run_reduce),
    Sample("sgemm", "matmul_tiled.c", ("-DTILE=16",), _run_sgemm),
)
TOLERANCE = 1e-5


def run_samples(handle: Handle, samples=SAMPLES, seed: int | None = None) -> list[SampleResult]:
    """Resolve each sample's program through the chain, run it on fresh random data, check it."""
    rng = np.random.default_rng(seed)
    results = []
    for s in samples:
        program = handle.program(s.kernel_file, s.options)
        t0 = time.perf_counter()
        err = s.run(handle, program, rng)
        handle.backend.synchronize()
        run_ms = (time.perf_counter() - t0) * 1e3
        results.append(SampleResult(s.name, s.kernel_file, program.options, program.source, program.total_ms, run_ms,
                                    err, err <= TOLERANCE, [(st.name, st.ms, st.outcome) for st in program.steps]))
    return results
