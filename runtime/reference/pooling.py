"""NumPy reference of 2-D pooling forward and backward (max with first-maximum indices, averages)."""

from __future__ import annotations

import numpy as np


def _windows(h_in, w_in, window, stride, pad):
    ho = (h_in + 2 * pad[0] - window[0]) // stride[0] + 1
    wo = (w_in + 2 * pad[1] - window[1]) // stride[1] + 1
    for i in range(ho):
        for j in range(wo):
            h0, w0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            hs, ws = range(max(h0, 0), min(h0 + window[0], h_in)), range(max(w0, 0), min(w0 + window[1], w_in))
            yield i, j, hs, ws


def forward(x, mode="max", window=(2, 2), stride=(2, 2), pad=(0, 0)):
    """``(y, indices)``; indices (h * W + w of the first maximum) only for max."""
    x = np.asarray(x, np.float64)
    n, c, h, w = x.shape
    ho, wo = (h + 2 * pad[0] - window[0]) // stride[0] + 1, (w + 2 * pad[1] - window[1]) // stride[1] + 1
    y, idx = np.zeros((n, c, ho, wo)), np.full((n, c, ho, wo), -1, np.int32)
    for i, j, hs, ws in _windows(h, w, window, stride, pad):
        block = x[:, :, hs.start:hs.stop, ws.start:ws.stop].reshape(n, c, -1)
        if mode == "max":
            at = block.argmax(axis=2)
            y[:, :, i, j] = np.take_along_axis(block, at[..., None], 2)[..., 0]
            idx[:, :, i, j] = (hs.start + at // len(ws)) * w + ws.start + at % len(ws)
        elif mode == "avg":
            y[:, :, i, j] = block.mean(axis=2)
        else:
            y[:, :, i, j] = block.sum(axis=2) / (window[0] * window[1])
    return y, idx


def backward(dy, x_shape, indices=None, mode="max", window=(2, 2), stride=(2, 2), pad=(0, 0)):
    dy = np.asarray(dy, np.float64)
    n, c, h, w = x_shape
    dx = np.zeros(x_shape)
    flat = dx.reshape(n, c, h * w)
    for i, j, hs, ws in _windows(h, w, window, stride, pad):
        if mode == "max":
            np.add.at(flat, (np.arange(n)[:, None], np.arange(c)[None, :], indices[:, :, i, j]), dy[:, :, i, j])
        else:
            count = len(hs) * len(ws) if mode == "avg" else window[0] * window[1]
            dx[:, :, hs.start:hs.stop, ws.start:ws.stop] += (dy[:, :, i, j] / count)[:, :, None, None]
    return dx
