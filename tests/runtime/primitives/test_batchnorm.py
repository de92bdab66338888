"""Batch normalisation on the chain device against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.batchnorm import BatchNormProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import batchnorm as ref
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc, packed_strides

from .conftest import TYPES

SHAPE = (5, 3, 4, 7)
# Planes of 32 elements: whole 16-byte vectors for every type (bn_fwd_infer_vec), and odd ones.
SHAPES = [SHAPE, (3, 5, 4, 8)]


def _params(rng, count):
    return (rng.standard_normal(count).astype(np.float32), rng.standard_normal(count).astype(np.float32))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("mode", ["spatial", "per_act"])
def test_training_backward_and_inference_match_the_reference(handle, mode, dtype, shape):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(len(mode) + shape[3])
    count = shape[1] if mode == "spatial" else shape[1] * shape[2] * shape[3]
    x = store(rng.standard_normal(shape) * 2 + 0.5)
    scale, bias = _params(rng, count)
    rm, rv = rng.standard_normal(count).astype(np.float32), rng.random(count).astype(np.float32) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()
    y, saved_mean, saved_invstd = kdbkit.batchnorm_training(handle, x, scale, bias, mode=mode, momentum=0.25,
                                                            running_mean=rm, running_var=rv, dtype=dtype)
    ry, rmean, rinv, new_rm, new_rv = ref.training(read(x), scale, bias, mode, 1e-5, 0.25, rm0, rv0)
    np.testing.assert_allclose(read(y), ry, rtol=tol * 4, atol=tol * 4)
    np.testing.assert_allclose(saved_mean, rmean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(saved_invstd, rinv, rtol=1e-4)
    np.testing.assert_allclose(rm, new_rm, rtol=1e-4, atol=1e-5)  # updated in place
    np.testing.assert_allclose(rv, new_rv, rtol=1e-4, atol=1e-5)
    dy = store(rng.standard_normal(shape))
    rdx, rds, rdb = ref.backward(read(x), read(dy), scale, mode)
    for stats in ((saved_mean, saved_invstd), (None, None)):  # saved, and computed again
        dx, dscale, dbias = kdbkit.batchnorm_backward(handle, x, dy, scale, *stats, mode=mode, dtype=dtype)
        np.testing.assert_allclose(read(dx), rdx, rtol=tol * 8, atol=tol * 8)
        np.testing.assert_allclose(dscale, rds, rtol=tol * 8, atol=tol * 8 * np.sqrt(x.size / count))
        np.testing.assert_allclose(dbias, rdb, rtol=tol * 8, atol=tol * 8 * np.sqrt(x.size / count))
    yi = kdbkit.batchnorm_inference(handle, x, scale, bias, rm, rv, mode=mode, dtype=dtype)
    np.testing.assert_allclose(read(yi), ref.inference(read(x), scale, bias, rm, rv, mode), rtol=tol * 4,
                               atol=tol * 4)


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("hw", [(48, 48), (40, 52)], ids=["2304", "2080"])
def test_inference_over_large_planes_matches_the_reference(handle, dtype, hw):
    """Planes of 2304 and 2080 elements (bn_fwd_infer_plane_vec: 260 to 576 vectors a plane,
    each plane's last chunk cut), and a y with planes apart (the strides the kernel takes)."""
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(hw[1])
    x = store(rng.standard_normal((2, 3, *hw)) * 2 + 0.5)
    scale, bias = _params(rng, 3)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32) + 0.5
    expected = ref.inference(read(x), scale, bias, mean, var, "spatial")
    np.testing.assert_allclose(read(kdbkit.batchnorm_inference(handle, x, scale, bias, mean, var, dtype=dtype)),
                               expected, rtol=tol * 4, atol=tol * 4)
    be = handle.backend
    wide = store(np.full((2, 4, *hw), 9.0))  # y's channel 3 of each image is not written
    y = DeviceTensor(be.to_device(wide), TensorDesc(DataType.parse(dtype), x.shape, packed_strides((2, 4, *hw))))
    kdbkit.batchnorm_inference(handle, x, scale, bias, mean, var, y=y, dtype=dtype)
    got = read(be.to_host(y.buffer, np.empty_like(wide)))
    np.testing.assert_allclose(got[:, :3], expected, rtol=tol * 4, atol=tol * 4)
    np.testing.assert_array_equal(got[:, 3], 9.0)


def test_parameters_in_miopen_shapes_and_no_running_statistics(handle):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    scale, bias = (a.reshape(1, 3, 1, 1) for a in _params(rng, 3))
    y, mean, invstd = kdbkit.batchnorm_training(handle, x, scale, bias)
    np.testing.assert_allclose(y, ref.training(x, scale, bias)[0], rtol=1e-5, atol=1e-5)


def test_config_and_bad_input(handle):
    problem = BatchNormProblem("train", "per_act", DataType.FP16, (2, 3, 4, 5), (60, 20, 5, 1), (60, 20, 5, 1))
    assert parse_config(problem.config()) == problem
    x = np.ones((2, 3, 4, 4), np.float32)
    one = np.ones(3, np.float32)
    with pytest.raises(ProblemError, match="scale has 2 elements; this batch norm has 3 channels"):
        kdbkit.batchnorm_training(handle, x, one[:2].copy(), one)
    with pytest.raises(ProblemError, match="one running statistic without the other"):
        kdbkit.batchnorm_training(handle, x, one, one, running_mean=one.copy())
    with pytest.raises(ProblemError, match="batch norm mode 'spatial2'"):
        kdbkit.batchnorm_inference(handle, x, one, one, one, one, mode="spatial2")
    with pytest.raises(ProblemError, match="2-D; batch norm takes"):
        kdbkit.batchnorm_inference(handle, np.ones((2, 3), np.float32), one, one, one, one)


@pytest.mark.parametrize("dtype", list(TYPES))
def test_both_training_solvers_agree_with_the_reference(handle, dtype):
    """BatchNormSplit (immediate mode's choice for spatial training) and BatchNormBlock, forced."""
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(13)
    x = store(rng.standard_normal((6, 4, 5, 9)) * 3 + 7)  # a large mean: the shifted one-pass variance
    scale, bias = _params(rng, 4)
    ry, rmean, rinv, new_rm, new_rv = ref.training(read(x), scale, bias, "spatial", 1e-5, 0.5, np.zeros(4), np.ones(4))
    for solver in ("BatchNormSplit", "BatchNormBlock"):
        rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
        y, mean, invstd = kdbkit.batchnorm_training(handle, x, scale, bias, momentum=0.5, running_mean=rm,
                                                    running_var=rv, dtype=dtype, solver=solver)
        np.testing.assert_allclose(read(y), ry, rtol=tol * 4, atol=tol * 4, err_msg=solver)
        np.testing.assert_allclose(mean, rmean, rtol=1e-4, err_msg=solver)
        np.testing.assert_allclose(invstd, rinv, rtol=1e-3, err_msg=solver)
        np.testing.assert_allclose(rv, new_rv, rtol=1e-3, err_msg=solver)


# BatchNormPersistent's shapes: one member per team, several (a last chunk shorter than the
# others), more channels than teams (several rounds), and channels of one image.
PERSISTENT_SHAPES = [(2, 3, 4, 8), (8, 5, 24, 40), (3, 70, 16, 16), (1, 2, 8, 8)]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("shape", PERSISTENT_SHAPES)
def test_the_persistent_training_solver_matches_the_reference(handle, dtype, shape):
    if handle.device.backend != "cuda":
        pytest.skip("BatchNormPersistent runs on CUDA only (KDB_TEST_BACKEND=cuda on the GPU machine)")
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(sum(shape))
    channels = shape[1]
    x = store(rng.standard_normal(shape) * 3 + 7)
    scale, bias = _params(rng, channels)
    ry, rmean, rinv, new_rm, new_rv = ref.training(read(x), scale, bias, "spatial", 1e-5, 0.5, np.zeros(channels),
                                                   np.ones(channels))
    for _ in range(3):  # the counters are back at zero after each launch
        rm, rv = np.zeros(channels, np.float32), np.ones(channels, np.float32)
        y, mean, invstd = kdbkit.batchnorm_training(handle, x, scale, bias, momentum=0.5, running_mean=rm,
                                                    running_var=rv, dtype=dtype, solver="BatchNormPersistent")
        np.testing.assert_allclose(read(y), ry, rtol=tol * 4, atol=tol * 4)
        np.testing.assert_allclose(mean, rmean, rtol=1e-4)
        np.testing.assert_allclose(invstd, rinv, rtol=1e-3)
        np.testing.assert_allclose(rm, new_rm, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(rv, new_rv, rtol=1e-3)


def test_the_persistent_training_solver_plans_its_teams(handle):
    from kdbkit.runtime.primitives.batchnorm.solvers.persistent import MAX_CHUNK, shared_bytes, team_plan

    def h100(chunk, members=1):  # 132 multiprocessors of 227 KiB, 4 groups each at most (registers)
        return 132 * min(4, 227 * 1024 // (shared_bytes(chunk, members) + 1024))

    vectors = 32 * 112 * 112 // 8  # ResNet-50's first norm, fp16
    members, chunk, teams = team_plan(vectors, 64, h100)
    assert members * chunk >= vectors and chunk <= MAX_CHUNK and members * teams <= h100(chunk, members)
    assert -(-64 // teams) * teams - 64 < teams  # no round of channels more than needed
    members, chunk, teams = team_plan(vectors * 2, 64, h100)  # fp32: shared memory, not registers, limits
    assert members * chunk >= vectors * 2 and members * teams <= h100(chunk, members)
    members, chunk, teams = team_plan(10, 3, lambda chunk, members: 8)  # small channels: every channel at once
    assert teams == 3 and members * teams <= 8 and members * chunk >= 10
    assert team_plan(MAX_CHUNK * 9, 1, lambda chunk, members: 8) is None  # more groups than can be resident
    members, chunk, teams = team_plan(vectors, 64, h100, 1024)  # a build with fewer vectors in flight
    assert chunk <= 1024 and members * chunk >= vectors
    problem = BatchNormProblem("train", "spatial", DataType.FP32, (2, 3, 4, 8), (96, 32, 8, 1), (96, 32, 8, 1))
    verdict = REGISTRY.find("BatchNormPersistent").is_applicable(problem, handle.device)
    assert bool(verdict) == (handle.device.backend == "cuda")
    if handle.device.backend != "cuda":
        assert "needs CUDA" in verdict.reason


def test_the_persistent_training_solver_builds_each_type_as_its_table_says():
    from kdbkit.runtime.primitives.batchnorm.solvers import persistent

    for dtype in (DataType.FP32, DataType.FP16, DataType.BF16):
        problem = BatchNormProblem("train", "spatial", dtype, (2, 3, 4, 8), (96, 32, 8, 1), (96, 32, 8, 1))
        regs, groups = persistent.build(dtype)
        options = persistent.program(problem).options
        assert (f"-DBN_REGS={regs}" in options) == (regs != 8)
        assert (f"-DBN_MIN_GROUPS={groups}" in options) == (groups is not None)
        assert persistent.max_chunk(dtype) == persistent.BLOCK * regs
    assert persistent.build(DataType.BF16) == persistent.build(DataType.FP32) == (4, 6)  # the H100's (docs/performance.md)


@pytest.mark.parametrize("channels", [16, 6], ids=["vectors", "elements"])  # whole 16-byte vectors, or not
@pytest.mark.parametrize("dtype", list(TYPES))
def test_channels_last_inference_matches_the_reference(handle, dtype, channels):
    from kdbkit.runtime.tensor import DeviceTensor, TensorDesc

    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(channels)
    n, h, w = 3, 5, 7
    memory = store(rng.standard_normal((n, h, w, channels)))  # N x H x W x C in memory
    desc = TensorDesc(DataType.parse(dtype), (n, channels, h, w), (h * w * channels, 1, w * channels, channels))
    be = handle.backend
    x = DeviceTensor(be.to_device(memory), desc)
    y = DeviceTensor(be.alloc(memory.nbytes), desc)
    scale, bias = _params(rng, channels)
    mean, var = rng.standard_normal(channels).astype(np.float32), rng.random(channels).astype(np.float32) + 0.5
    kdbkit.batchnorm_inference(handle, x, scale, bias, mean, var, y=y)
    got = read(be.to_host(y.buffer, np.empty_like(memory))).transpose(0, 3, 1, 2)
    want = ref.inference(read(memory).transpose(0, 3, 1, 2), scale, bias, mean, var, "spatial")
    np.testing.assert_allclose(got, want, rtol=tol * 4, atol=tol * 4)
