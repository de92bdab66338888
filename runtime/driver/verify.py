"""How the driver compares a kernel's outputs with the reference's.

An output's error is its largest element difference relative to the reference's largest
magnitude, or to 1 (the inputs' scale: they are standard normal) when that is smaller:
``max |got - expected| / max(1, max |expected|)``. As MIOpen's rms_range (its driver's
measure) divides by the largest magnitude, the rounding of the type and of a long sum (a layer
norm's weight gradient adds every row) stay below the tolerance, a wrong element does not; the
floor keeps an output that is all cancellation (a layer norm's dx over two elements) from
turning float32 noise into a large relative error. NaN where the reference has NaN counts as
right; NaN or inf anywhere else is an infinite error.
"""

from __future__ import annotations

import numpy as np


def max_error(got: np.ndarray, expected: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    expected = np.asarray(expected, np.float64)
    if got.size != expected.size:
        raise ValueError(f"the reference has {expected.size} values for {got.size} elements")
    if not got.size:
        return 0.0
    expected = expected.reshape(got.shape)
    both_nan = np.isnan(got) & np.isnan(expected)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(both_nan, 0.0, np.abs(got - expected))
    if not np.isfinite(diff).all():
        return float("inf")
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    return float(diff.max()) / scale
