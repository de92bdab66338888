"""Host arrays on their way to the device: what cannot fit is refused before it is copied."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.tensor import DeviceTensor

HUGE = 10**12  # elements: 4 TB as float32, more than any device or host here holds


def test_a_huge_broadcast_input_is_refused_before_it_is_copied(make_handle):
    """np.broadcast_to of one number is 4 bytes on the host but was copied packed: MemoryError."""
    handle = make_handle()
    x = np.broadcast_to(np.float32(1.0), (HUGE,))
    with pytest.raises(ProblemError, match=rf"^x \({HUGE}\) is {4 * HUGE} bytes .* more than .* holds"):
        kdbkit.activation_forward(handle, x, "relu")
    with pytest.raises(ProblemError, match=rf"^b \(1x{HUGE}\) is {4 * HUGE} bytes"):
        kdbkit.op_tensor(handle, "add", np.ones((1, 4), np.float32), np.broadcast_to(np.float32(1.0), (1, HUGE)))
    with pytest.raises(ProblemError, match=rf"^the array \({HUGE}\) is {4 * HUGE} bytes"):
        DeviceTensor.from_host(handle.backend, x)


def test_an_output_larger_than_the_device_is_refused_before_it_is_made(make_handle):
    handle = make_handle()
    w = np.ones((HUGE // 10**6, 1), np.float32)
    with pytest.raises(ProblemError, match=r"^c \(1000000x1000000\) would be 4000000000000 bytes, more than"):
        kdbkit.gemm(handle, w, w.T.copy())


def test_a_small_broadcast_input_still_works(make_handle):
    handle = make_handle()
    y = kdbkit.activation_forward(handle, np.broadcast_to(np.float32(-1.0), (3, 4)), "relu")
    assert y.shape == (3, 4) and not y.any()
