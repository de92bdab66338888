"""NumPy reference of every activation mode, forward and backward, in float64."""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])
_K = math.sqrt(2.0 / math.pi)
_EPS = 1e-6


def forward(x: np.ndarray, mode: int, alpha: float = 0.0, beta: float = 0.0, gamma: float = 0.0) -> np.ndarray:
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mode == 1:
            return 1.0 / (1.0 + np.exp(-x))
        if mode == 2:
            return beta * np.tanh(alpha * x)
        if mode == 3:
            return np.maximum(x, 0.0)
        if mode == 4:
            return np.logaddexp(0.0, x)
        if mode == 5:
            return np.abs(x)
        if mode == 6:
            base = alpha + beta * x
            return np.where(base <= _EPS, 0.0, np.power(np.maximum(base, _EPS), gamma))
        if mode == 7:
            return np.minimum(alpha, np.maximum(x, 0.0))
        if mode == 8:
            return np.where(x > 0, x, alpha * x)
        if mode == 9:
            return np.where(x > 0, x, alpha * np.expm1(x))
        if mode == 10:
            return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
        if mode == 11:
            return 0.5 * x * (1.0 + np.tanh(_K * (x + 0.044715 * x**3)))
    return x.copy()


def backward(x: np.ndarray, y: np.ndarray, dy: np.ndarray, mode: int, alpha: float = 0.0, beta: float = 0.0,
             gamma: float = 0.0) -> np.ndarray:
    x, y, dy = (np.asarray(a, np.float64) for a in (x, y, dy))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mode == 1:
            return dy * y * (1.0 - y)
        if mode == 2:
            return np.zeros_like(x) if abs(beta) <= _EPS else dy * alpha * (beta - y * y / beta)
        if mode == 3:
            return np.where(x > 0, dy, 0.0)
        if mode == 4:
            return dy / (1.0 + np.exp(-np.minimum(x, 50.0)))
        if mode == 5:
            return np.where(x > 0, dy, -dy)
        if mode == 6:
            base = alpha + beta * x
            return np.where(base <= _EPS, 0.0, dy * gamma * beta * y / np.where(base <= _EPS, 1.0, base))
        if mode == 7:
            return np.where((x > 0) & (x <= alpha), dy, 0.0)
        if mode == 8:
            return np.where(x > 0, dy, alpha * dy)
        if mode == 9:
            return np.where(x > 0, dy, dy * (y + alpha))
        if mode == 10:
            cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
            return dy * (cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))
        if mode == 11:
            t = np.tanh(_K * (x + 0.044715 * x**3))
            return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _K * (1.0 + 3 * 0.044715 * x * x))
    return dy.copy()
