"""The primitives' scalar and integer arguments: a value that is no number, or no integer where
one is meant, is a ProblemError naming the argument, not a ValueError or a silent truncation."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError

x4 = np.ones((1, 2, 5, 5), np.float32)
w4 = np.ones((3, 2, 3, 3), np.float32)
m = np.ones((2, 3), np.float32)
rows = np.ones((2, 4), np.float32)
per_channel = np.ones(2, np.float32)

SCALAR_CALLS = {
    "gemm alpha": lambda h, v: kdbkit.gemm(h, m, m.T.copy(), alpha=v),
    "gemm beta": lambda h, v: kdbkit.gemm(h, m, m.T.copy(), beta=v),
    "activation alpha": lambda h, v: kdbkit.activation_forward(h, rows, "relu", alpha=v),
    "activation_backward gamma": lambda h, v: kdbkit.activation_backward(h, rows, rows, rows, "relu", gamma=v),
    "softmax beta": lambda h, v: kdbkit.softmax_forward(h, x4, beta=v),
    "softmax_backward alpha": lambda h, v: kdbkit.softmax_backward(h, x4, x4, alpha=v),
    "op_tensor alpha2": lambda h, v: kdbkit.op_tensor(h, "add", rows, rows, alpha2=v),
    "batchnorm eps": lambda h, v: kdbkit.batchnorm_inference(h, x4, per_channel, per_channel, per_channel,
                                                             per_channel, eps=v),
    "batchnorm_training momentum": lambda h, v: kdbkit.batchnorm_training(h, x4, per_channel, per_channel,
                                                                          momentum=v),
    "layernorm eps": lambda h, v: kdbkit.layernorm_forward(h, rows, eps=v),
}


@pytest.mark.parametrize("value", ["x", "1.5", b"1", None, 1j, True, [1.0]], ids=repr)
@pytest.mark.parametrize("call", list(SCALAR_CALLS))
def test_a_scalar_that_is_no_number_is_refused_by_name(handle, call, value):
    name = call.split()[-1]
    with pytest.raises(ProblemError, match=rf"^{name}=.* is not a number; pass {name} as a float"):
        SCALAR_CALLS[call](handle, value)


INTEGER_CALLS = {
    "convolution pad": lambda h, v: kdbkit.convolution_forward(h, x4, w4, pad=v),
    "convolution stride": lambda h, v: kdbkit.convolution_forward(h, x4, w4, stride=(1, v)),
    "convolution dilation": lambda h, v: kdbkit.convolution_forward(h, x4, w4, dilation=v),
    "convolution groups": lambda h, v: kdbkit.convolution_forward(h, x4, w4, groups=v),
    "x_shape": lambda h, v: kdbkit.convolution_backward_data(h, np.ones((1, 3, 3, 3), np.float32), w4, (1, 2, 5, v)),
    "pooling window": lambda h, v: kdbkit.pooling_forward(h, x4, window=(v, 2)),
    "pooling pad": lambda h, v: kdbkit.pooling_forward(h, x4, pad=v),
    "dim": lambda h, v: kdbkit.layernorm_forward(h, rows, dim=v),
}


@pytest.mark.parametrize("value", [1.5, 1.0, "1", True, None], ids=repr)
@pytest.mark.parametrize("call", list(INTEGER_CALLS))
def test_an_integer_parameter_takes_only_integers(handle, call, value):
    """``pad=1.5`` was truncated to 1 and ``pad="1"`` taken; a bool is no size either."""
    name = call.split()[-1]
    with pytest.raises(ProblemError, match=rf"{name}={value!r} is not an integer; pass {name} as an int"):
        INTEGER_CALLS[call](handle, value)


def test_numpy_numbers_are_numbers(handle):
    y = kdbkit.convolution_forward(handle, x4, w4, pad=np.int64(1), stride=(np.int32(1), 1), groups=np.int16(1))
    assert y.shape == (1, 3, 5, 5)
    c = kdbkit.gemm(handle, m, m.T.copy(), alpha=np.float32(2), beta=np.int64(0))
    np.testing.assert_allclose(c, 2 * m @ m.T)
