"""NumPy reference of 2-D convolution in its three directions (float64, groups, padding,
stride, dilation), each filter tap a matrix product over the channels of a group."""

from __future__ import annotations

import numpy as np


def _out(size: int, f: int, pad: int, stride: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (f - 1) - 1) // stride + 1


def _taps(x_shape, w_shape, pad, stride, dilation, groups):
    """Per group and filter tap: the group's channel slices and the padded input's window of
    the tap (rows and columns every output reads)."""
    n, c, h, w = x_shape
    k, cg, fy, fx = w_shape
    ho, wo = _out(h, fy, pad[0], stride[0], dilation[0]), _out(w, fx, pad[1], stride[1], dilation[1])
    kg = k // groups
    for g in range(groups):
        for i in range(fy):
            for j in range(fx):
                rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (ho - 1) + 1, stride[0])
                cols = slice(j * dilation[1], j * dilation[1] + stride[1] * (wo - 1) + 1, stride[1])
                yield slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg), i, j, rows, cols


def _padded(x, pad):
    return np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))


def forward(x, w, pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
    """y (N x K x Ho x Wo) of x (N x C x H x W) and w (K x C/G x Y x X)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, _, h, wd = x.shape
    k, _, fy, fx = w.shape
    xp = _padded(x, pad)
    y = np.zeros((n, k, _out(h, fy, pad[0], stride[0], dilation[0]), _out(wd, fx, pad[1], stride[1], dilation[1])))
    for cs, ks, i, j, rows, cols in _taps(x.shape, w.shape, pad, stride, dilation, groups):
        y[:, ks] += np.einsum("nchw,kc->nkhw", xp[:, cs, rows, cols], w[ks, :, i, j])
    return y


def backward_data(dy, w, x_shape, pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
    """dx (``x_shape``) from dy and w."""
    dy, w = np.asarray(dy, np.float64), np.asarray(w, np.float64)
    n, c, h, wd = x_shape
    dxp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    for cs, ks, i, j, rows, cols in _taps(x_shape, w.shape, pad, stride, dilation, groups):
        dxp[:, cs, rows, cols] += np.einsum("nkhw,kc->nchw", dy[:, ks], w[ks, :, i, j])
    return dxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]


def backward_weights(dy, x, w_shape, pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
    """dw (``w_shape``) from dy and x."""
    dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
    xp = _padded(x, pad)
    dw = np.zeros(w_shape)
    for cs, ks, i, j, rows, cols in _taps(x.shape, w_shape, pad, stride, dilation, groups):
        dw[ks, :, i, j] = np.einsum("nkhw,nchw->kc", dy[:, ks], xp[:, cs, rows, cols])
    return dw
