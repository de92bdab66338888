"""The TMA GEMM (GemmTma*, kernels/gemm_tma.cu): its programs compile offline for sm_90a, the
tile choice, the tensor maps' shapes and the gates need no GPU; on an sm_90 GPU
(KDB_TEST_BACKEND=cuda) every tile shape, type and transposition against NumPy, on tiles cut at
every edge, batched with strides or one shared B, and over more tiles than multiprocessors."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.immediate import choose, invoker
from kdbkit.runtime.primitives.gemm import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers import tma
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType

from .conftest import TYPES

TMA_SOLVERS = ("GemmTma128x256", "GemmTma128x192", "GemmTma128x128")
TRANSPOSITIONS = [(False, False), (True, False), (False, True), (True, True)]


def sm90(cu: int = 132) -> DeviceInfo:
    target = Target.parse(f"sm_90_{cu}")
    return DeviceInfo("cuda", 0, "an sm_90 device", target, 80 << 30)


def problem(m, n, k, ta=False, tb=False, batch=1, dtype=DataType.BF16, pad=0, shared_b=False) -> GemmProblem:
    """Leading dimensions the rows they stride over rounded up to 8 elements (what tensor copies
    take), then ``pad`` more; batches one after another."""
    lda, ldb, ldc = (-(-cols // 8) * 8 + pad for cols in ((m if ta else k), (k if tb else n), n))
    sa, sb = ((k if ta else m) * lda, 0 if shared_b else (n if tb else k) * ldb) if batch > 1 else (0, 0)
    return GemmProblem(dtype, m, n, k, ta, tb, batch, lda, ldb, ldc, sa, sb, m * ldc if batch > 1 else 0)


# ---------------------------------------------------------------- no GPU needed


@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
@pytest.mark.parametrize("ta, tb", TRANSPOSITIONS)
def test_every_program_compiles_offline_for_sm90a(name, dtype, ta, tb):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    (request,) = REGISTRY.find(name).programs(problem(64, 64, 64, ta, tb, dtype=dtype))
    cubin = compile_file(Target.parse("sm_90"), request.kernel_file, *request.options, compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == "sm_90" and b"\0gemm_tma\0" in cubin  # an sm_90 GPU loads it


@pytest.mark.parametrize("m, n, k, batch, expected", [
    (4096, 4096, 4096, 1, 256), (8192, 8192, 8192, 1, 256),  # 512 and 2048 tiles of 128 x 256: full waves
    (4096, 768, 768, 1, 192), (4096, 2304, 768, 1, 192),  # BERT-base: 128 and 384 tiles of 128 x 192
    (4096, 3072, 768, 1, 256), (4096, 768, 3072, 1, 192),
    (128, 128, 64, 1, 128),  # one tile: the narrowest wastes least
])
def test_the_tile_shape_follows_the_waves(m, n, k, batch, expected):
    p = problem(m, n, k, batch=batch)
    assert tma.tile_n_for(p, 132) == expected
    chosen = [REGISTRY.find(name) for name in TMA_SOLVERS if REGISTRY.find(name).suits(p, sm90())]
    assert [s.tile_n for s in chosen] == [expected]
    passed = REGISTRY.find("GemmTma128x128" if expected != 128 else "GemmTma128x256").suits(p, sm90())
    assert f"128 x {expected} tiles fit this shape better on 132 multiprocessors" in passed.reason


def test_immediate_mode_prefers_the_tma_kernels_on_sm90():
    choice = choose_on(sm90(), problem(4096, 768, 768, tb=True))
    assert choice.solver.name == "GemmTma128x192"
    assert choice.trace[0].startswith("GemmTma128x256: applies, passed over: 128 x 192 tiles fit")
    assert choose_on(sm90(), problem(4096, 4096, 4096, ta=True)).solver.name == "GemmTma128x256"
    fp32 = choose_on(sm90(), problem(256, 256, 256, dtype=DataType.FP32))
    assert fp32.trace[0] == "GemmTma128x256: rejected, fp32 is not fp16 or bf16"
    sm80 = choose_on(DeviceInfo("cuda", 0, "an sm_80 device", Target.parse("sm_80_108"), 80 << 30),
                     problem(256, 256, 256))
    assert sm80.solver.name == "GemmTensorCore"
    assert sm80.trace[0] == "GemmTma128x256: rejected, wgmma and TMA need an sm_90 GPU (this is sm_80)"


def choose_on(device: DeviceInfo, p: GemmProblem):
    from kdbkit.runtime.immediate import heuristic

    return heuristic(p, device, ())


@pytest.mark.parametrize("change, reason", [
    (dict(lda=102), "not a multiple of 8 elements"),
    (dict(ldc=97), "ldc or C's batch stride is odd"),
    (dict(batch=2, stride_a=8, stride_b=96 * 96, stride_c=96 * 97), "the batches of A or B overlap"),
])
def test_the_gates_name_what_tensor_copies_cannot_take(change, reason):
    base = dict(dtype=DataType.FP16, m=96, n=96, k=100, lda=104, ldb=96, ldc=96)
    verdict = REGISTRY.find("GemmTma128x256").is_applicable(GemmProblem(**{**base, **change}), sm90())
    assert not verdict and reason in verdict.reason


def test_the_tensor_maps_follow_each_operands_layout():
    """(contiguous dimension, rows, batch), byte strides, boxes: A K-major in 64 x 128 boxes,
    M-major in 64 x 64; B N-major in 64 x 64, K-major in 64 x tile N; a B shared by every batch
    has one matrix."""
    p = problem(300, 200, 72, batch=3, pad=8)
    a, b = tma.operand_maps(p, 256)
    assert a == ((72, 300, 3), (2 * 80, 2 * 300 * 80), (64, 128, 1))
    assert b == ((200, 72, 3), (2 * 208, 2 * 72 * 208), (64, 64, 1))
    assert problem(300, 201, 72).ldc == 208
    p = problem(300, 200, 72, ta=True, tb=True, batch=3, pad=8, shared_b=True)
    a, b = tma.operand_maps(p, 192)
    assert a == ((300, 72, 3), (2 * 312, 2 * 72 * 312), (64, 64, 1))
    assert b == ((72, 200, 1), (2 * 80, 2 * 200 * 80), (64, 192, 1))  # one B: its own size as batch stride


class _Buffer:
    def __init__(self, ptr):
        self.ptr = ptr


class _Launch:
    """A launch as OperandLaunches sees one: its maps, and how it was made."""

    def __init__(self, maps, made, how="made"):
        self.maps, self._made = maps, made
        made.append((how, maps))

    def rebound(self, *maps):
        return _Launch(maps, self._made, "rebound")


def _launches():
    made: list = []
    return tma.OperandLaunches(lambda a, b: (a, b), lambda maps: _Launch(maps, made)), made


def test_a_launch_is_made_once_per_operand_pair_and_the_least_recently_met_go_first():
    """The launches the TMA GEMM and convolutions keep by their operands' addresses (a tensor map
    holds one): the first pair's launch is made, a later pair's is the first one rebound to its
    maps; a pair met again reuses its launch; past CACHED_PAIRS pairs the one met least recently
    is made anew."""
    launches, made = _launches()
    assert launches.get(_Buffer(16), _Buffer(32)).maps == (16, 32)
    assert launches.get(_Buffer(16), _Buffer(32)).maps == (16, 32) and made == [("made", (16, 32))]
    assert launches.get(_Buffer(32), _Buffer(16)).maps == (32, 16)  # the order of a pair counts
    assert made[-1] == ("rebound", (32, 16)) and len(made) == 2
    for i in range(tma.CACHED_PAIRS - 2):
        launches.get(_Buffer(1000 + i), _Buffer(0))
    launches.get(_Buffer(16), _Buffer(32))  # met again: now the most recent
    launches.get(_Buffer(5000), _Buffer(0))  # one pair too many: (32, 16), met least recently, goes
    assert len(made) == 1 + tma.CACHED_PAIRS
    launches.get(_Buffer(16), _Buffer(32))
    assert len(made) == 1 + tma.CACHED_PAIRS  # kept
    launches.get(_Buffer(32), _Buffer(16))
    assert made[-1] == ("rebound", (32, 16)) and len(made) == 2 + tma.CACHED_PAIRS  # made again
    assert sum(how == "made" for how, _ in made) == 1  # only the first pair's launch was packed


def test_a_network_cycling_through_its_layers_weights_makes_each_launch_once():
    """BERT-base calls its 768 x 768 projection with 48 weight matrices in turn, every forward:
    after the first forward, no launch is made again."""
    launches, made = _launches()
    for _ in range(3):
        for layer in range(48):
            launches.get(_Buffer(0x1000 * (layer + 1)), _Buffer(0x100000 + 0x1000 * layer))
    assert len(made) == 48


def test_every_tile_shape_fits_the_shared_memory_of_a_block():
    assert all(tma.shared_bytes(n) <= 227 * 1024 for n in tma.STAGES)


# ---------------------------------------------------------------- on an sm_90 GPU


@pytest.fixture
def sm90_handle(handle):
    if handle.device.backend != "cuda" or not handle.device.target.arch_facts.has("wgmma"):
        pytest.skip("the TMA GEMM needs an sm_90 GPU (KDB_TEST_BACKEND=cuda on the H100/H200 machine)")
    return handle


def run_and_check(handle, name: str, p: GemmProblem, seed: int) -> None:
    """Random operands laid out as ``p`` says, C poisoned outside the product (its padding must
    survive), the solver's invoker run, and C against float64 NumPy."""
    store, read, tol = TYPES[p.dtype.label]
    rng = np.random.default_rng(seed)
    a_rows, a_cols = (p.k, p.m) if p.trans_a else (p.m, p.k)
    b_rows, b_cols = (p.n, p.k) if p.trans_b else (p.k, p.n)
    batches_b = p.batch if p.stride_b else 1
    a = store(rng.standard_normal((p.batch, a_rows, p.lda)))
    b = store(rng.standard_normal((batches_b, b_rows, p.ldb)))
    c0 = store(rng.standard_normal((p.batch, p.m, p.ldc)))
    be = handle.backend
    buffers = [be.to_device(v) for v in (a, b, c0)]
    try:
        invoker(handle, p, REGISTRY.find(name))(a=buffers[0], b=buffers[1], c=buffers[2])
        out = read(be.to_host(buffers[2], np.empty_like(c0)))
    finally:
        for buffer in buffers:
            buffer.free()
    op_a = read(a)[:, :, :a_cols].astype(np.float64)
    op_b = read(b)[:, :, :b_cols].astype(np.float64)
    op_a = op_a.transpose(0, 2, 1) if p.trans_a else op_a
    op_b = op_b.transpose(0, 2, 1) if p.trans_b else op_b
    expected = p.alpha * (op_a @ op_b) + p.beta * read(c0)[:, :, :p.n]
    np.testing.assert_allclose(out[:, :, :p.n], expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(p.k), err_msg=name)
    np.testing.assert_array_equal(out[:, :, p.n:], read(c0)[:, :, p.n:])  # nothing written past N


@pytest.mark.gpu
@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
@pytest.mark.parametrize("ta, tb", TRANSPOSITIONS)
def test_tiles_cut_at_every_edge(sm90_handle, name, dtype, ta, tb):
    """M, N, K no multiple of a tile or a K step, leading dimensions wider than the rows,
    two batches with their own B, alpha and beta."""
    p = problem(300, 333, 77, ta, tb, batch=2, dtype=dtype, pad=8)
    p = GemmProblem(**{**p.__dict__, "alpha": 0.5, "beta": -1.5})
    run_and_check(sm90_handle, name, p, seed=ta * 2 + tb)


@pytest.mark.gpu
@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
def test_a_chunk_cut_by_n_leaves_the_staging_element_by_element(sm90_handle, name, dtype):
    """beta 0 and 16-byte rows of C (ldc 344) but N = 333: the edge tiles' last 8-column chunk
    is five columns of C and three of its padding, which must survive."""
    run_and_check(sm90_handle, name, problem(300, 333, 77, dtype=dtype, pad=8), seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("ta, tb", TRANSPOSITIONS)
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_more_tiles_than_multiprocessors_and_a_shared_b(sm90_handle, name, ta, tb, beta):
    """Each block walks several tiles (its ring of stages runs on across them), over three
    batches that share one B; tiles leave through the staged 16-byte stores (beta 0, which
    never reads C; the edge tiles' rows and chunks past M and N left out) or the element path
    (beta 0.5)."""
    p = problem(128 * 20 - 5, 256 * 9 + 64, 320, ta, tb, batch=3, shared_b=True)
    run_and_check(sm90_handle, name, GemmProblem(**{**p.__dict__, "beta": beta}), seed=7)


@pytest.mark.gpu
def test_immediate_mode_takes_the_tma_kernel_and_pointers_it_has_not_seen(sm90_handle):
    import kdbkit

    store, read, tol = TYPES["fp16"]
    rng = np.random.default_rng(3)
    for _ in range(3):  # new buffers each call: new tensor maps
        a, b = store(rng.standard_normal((512, 256))), store(rng.standard_normal((256, 384)))
        c = kdbkit.gemm(sm90_handle, a, b, dtype="fp16")
        np.testing.assert_allclose(read(c), read(a).astype(np.float64) @ read(b), rtol=tol * 4, atol=tol * 4 * 16)
    choice = choose(sm90_handle, problem(512, 384, 256, dtype=DataType.FP16))
    assert choice.solver.name.startswith("GemmTma")
