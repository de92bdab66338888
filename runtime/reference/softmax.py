"""NumPy reference of softmax and log-softmax, forward and backward, in float64."""

from __future__ import annotations

import numpy as np


def _axes(mode: str, ndim: int) -> tuple[int, ...]:
    return (1,) if mode == "channel" else tuple(range(1, ndim))


def forward(x: np.ndarray, algorithm: str = "accurate", mode: str = "channel") -> np.ndarray:
    x = np.asarray(x, np.float64)
    axes = _axes(mode, x.ndim)
    shifted = x - x.max(axis=axes, keepdims=True)
    if algorithm == "log":
        return shifted - np.log(np.exp(shifted).sum(axis=axes, keepdims=True))
    e = np.exp(shifted)
    return e / e.sum(axis=axes, keepdims=True)


def backward(y: np.ndarray, dy: np.ndarray, algorithm: str = "accurate", mode: str = "channel") -> np.ndarray:
    y, dy = np.asarray(y, np.float64), np.asarray(dy, np.float64)
    axes = _axes(mode, y.ndim)
    if algorithm == "log":
        return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
    return (dy - (dy * y).sum(axis=axes, keepdims=True)) * y
