"""NumPy reference of layer normalisation forward and backward, in float64."""

from __future__ import annotations

import numpy as np


def forward(x, weight=None, bias=None, dim: int = -1, eps: float = 1e-5):
    """``(y, mean, rstd)``, mean and rstd of shape x.shape[:dim]."""
    x = np.asarray(x, np.float64)
    dim = dim + x.ndim if dim < 0 else dim
    axes = tuple(range(dim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)
    return y, mean.reshape(x.shape[:dim]), rstd.reshape(x.shape[:dim])


def backward(x, dy, mean, rstd, weight=None, dim: int = -1):
    """``(dx, dweight, dbias)``; the last two None without a weight."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    dim = dim + x.ndim if dim < 0 else dim
    axes = tuple(range(dim, x.ndim))
    shape = x.shape[:dim] + (1,) * (x.ndim - dim)
    mean, rstd = np.asarray(mean, np.float64).reshape(shape), np.asarray(rstd, np.float64).reshape(shape)
    xhat = (x - mean) * rstd
    g = dy * np.asarray(weight, np.float64) if weight is not None else dy
    inner = int(np.prod(x.shape[dim:]))
    dx = rstd * (g - (g.sum(axis=axes, keepdims=True) + xhat * (g * xhat).sum(axis=axes, keepdims=True)) / inner)
    if weight is None:
        return dx, None, None
    rows = tuple(range(dim))
    return dx, (dy * xhat).sum(axis=rows), dy.sum(axis=rows)
