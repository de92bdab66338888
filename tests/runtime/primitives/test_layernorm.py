"""Layer normalisation on the chain device against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.layernorm import LayerNormProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import layernorm as ref
from kdbkit.runtime.tensor import DataType

from .conftest import TYPES


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape, dim", [((4, 33), -1), ((2, 3, 300), 2), ((3, 5, 7), 1), ((5, 2), 0),
                                        ((2, 3000), 1),  # a row longer than registers hold: the 3-pass path
                                        # whole 16-byte vectors for every type (LayerNormLanes): one
                                        # lane per row, a warp per row, and the long-row program
                                        ((5, 8), -1), ((3, 7, 512), 2), ((2, 16384), 1)])
def test_forward_and_backward_match_the_reference(handle, shape, dim, affine, dtype):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(len(shape) + dim)
    row = shape[dim:]
    x, dy = store(rng.standard_normal(shape) * 3 + 1), store(rng.standard_normal(shape))
    w, b = (store(rng.standard_normal(row)), store(rng.standard_normal(row))) if affine else (None, None)
    y, mean, rstd = kdbkit.layernorm_forward(handle, x, w, b, dim=dim, dtype=dtype)
    ry, rm, rr = ref.forward(read(x), None if w is None else read(w), None if b is None else read(b), dim)
    np.testing.assert_allclose(read(y), ry, rtol=tol, atol=tol * 4)
    np.testing.assert_allclose(mean, rm, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, rr, rtol=1e-4)
    assert mean.dtype == rstd.dtype == np.float32
    dx, dw, db = kdbkit.layernorm_backward(handle, x, dy, mean, rstd, w, dim=dim, dtype=dtype)
    rdx, rdw, rdb = ref.backward(read(x), read(dy), mean, rstd, None if w is None else read(w), dim)
    np.testing.assert_allclose(read(dx), rdx, rtol=tol * 4, atol=tol * 4)
    if affine:
        scale = np.sqrt(np.prod(shape[:dim]) if dim else 1)  # sums over rows: error grows with their number
        np.testing.assert_allclose(read(dw), rdw, rtol=tol * 4, atol=tol * 4 * scale)
        np.testing.assert_allclose(read(db), rdb, rtol=tol * 4, atol=tol * 4 * scale)
    else:
        assert dw is None and db is None


def test_immediate_mode_takes_the_lanes_kernel_for_rows_of_whole_vectors(handle):
    from kdbkit.runtime.immediate import choose

    def chosen(shape, dtype):
        return choose(handle, LayerNormProblem("fwd", dtype, shape, len(shape) - 1, True, 1e-5)).solver.name

    assert chosen((64, 768), DataType.FP16) == chosen((64, 1020), DataType.FP32) == "LayerNormLanes"
    assert chosen((64, 1020), DataType.FP16) == "LayerNormBlock"  # 1020 is not whole vectors of 8
    assert chosen((64, 70000), DataType.FP32) == "LayerNormBlock"  # longer than registers hold


def test_config_and_bad_input(handle):
    problem = LayerNormProblem("fwd", DataType.BF16, (8, 128, 768), 2, True, 1e-5)
    assert problem.config() == "layernorm,dir=fwd,type=bf16,shape=8x128x768,dim=2,affine=1,eps=1e-05"
    assert parse_config(problem.config()) == problem
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ProblemError, match="weight without a bias"):
        kdbkit.layernorm_forward(handle, x, np.ones(8, np.float32))
    with pytest.raises(ProblemError, match=r"weight has shape \(4,\), the normalised dimensions are \(8,\)"):
        kdbkit.layernorm_forward(handle, x, np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ProblemError, match="layer norm dim 2 for a 2-D tensor"):
        kdbkit.layernorm_forward(handle, x, dim=2)
    with pytest.raises(ProblemError, match="layer norm eps 0.0"):
        kdbkit.layernorm_forward(handle, x, eps=0)
    y, mean, rstd = kdbkit.layernorm_forward(handle, x)
    with pytest.raises(ProblemError, match=r"mean has shape \(3,\), expected \(4,\)"):
        kdbkit.layernorm_backward(handle, x, x, mean[:3].copy(), rstd)


def test_unaligned_tensors_take_the_block_solver(handle, monkeypatch):
    """LayerNormLanes hands a call whose tensors are not 16-byte aligned to LayerNormBlock."""
    from kdbkit.runtime.primitives.layernorm.solvers import lanes as lanes_solver

    monkeypatch.setattr(lanes_solver, "aligned16", lambda *tensors: False)
    rng = np.random.default_rng(22)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((5, 64), 64, 64))
    y, mean, rstd = kdbkit.layernorm_forward(handle, x, w, b, solver="LayerNormLanes")
    ry, rm, rr = ref.forward(x, w, b, 1)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, rm, rtol=1e-5, atol=1e-6)
