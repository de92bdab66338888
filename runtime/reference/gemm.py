"""NumPy reference of the batched, transposed GEMM, in float64."""

from __future__ import annotations

import numpy as np


def gemm(a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, c=None):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if trans_a:
        a = np.swapaxes(a, -1, -2)
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    out = alpha * np.matmul(a, b)
    return out + beta * np.asarray(c, np.float64) if beta else out
