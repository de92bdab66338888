"""NumPy reference of batch normalisation (inference, training, backward), in float64."""

from __future__ import annotations

import numpy as np


def _axes(mode: str) -> tuple[int, ...]:
    return (0, 2, 3) if mode == "spatial" else (0,)


def _shape(x: np.ndarray, mode: str) -> tuple[int, ...]:
    return (1, x.shape[1], 1, 1) if mode == "spatial" else (1, *x.shape[1:])


def inference(x, scale, bias, mean, var, mode="spatial", eps=1e-5):
    x = np.asarray(x, np.float64)
    p = [np.asarray(a, np.float64).reshape(_shape(x, mode)) for a in (scale, bias, mean, var)]
    return p[0] * (x - p[2]) / np.sqrt(p[3] + eps) + p[1]


def training(x, scale, bias, mode="spatial", eps=1e-5, momentum=0.1, running_mean=None, running_var=None):
    """``(y, saved_mean, saved_invstd, new_running_mean, new_running_var)``."""
    x = np.asarray(x, np.float64)
    axes, shape = _axes(mode), _shape(x, mode)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    invstd = 1.0 / np.sqrt(var + eps)
    y = np.asarray(scale, np.float64).reshape(shape) * (x - mean) * invstd + np.asarray(bias, np.float64).reshape(shape)
    members = x.size // mean.size
    unbiased = var * members / max(members - 1, 1)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = (1 - momentum) * np.asarray(running_mean, np.float64).ravel() + momentum * mean.ravel()
        new_rv = (1 - momentum) * np.asarray(running_var, np.float64).ravel() + momentum * unbiased.ravel()
    return y, mean.ravel(), invstd.ravel(), new_rm, new_rv


def backward(x, dy, scale, mode="spatial", eps=1e-5):
    """``(dx, dscale, dbias)`` from the batch's own statistics."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    axes, shape = _axes(mode), _shape(x, mode)
    mean = x.mean(axis=axes, keepdims=True)
    invstd = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    xhat = (x - mean) * invstd
    m = x.size // mean.size
    dbias, dscale = dy.sum(axis=axes, keepdims=True), (dy * xhat).sum(axis=axes, keepdims=True)
    dx = np.asarray(scale, np.float64).reshape(shape) * invstd / m * (m * dy - dbias - xhat * dscale)
    return dx, dscale.ravel(), dbias.ravel()
