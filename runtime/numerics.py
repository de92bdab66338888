"""KDB_CHECK_NUMERICS: scan a primitive call's inputs and outputs for inf, NaN and all-zeros.

MIOpen's bit flags (MIOPEN_CHECK_NUMERICS), with the same values: 0x01 report every check,
0x02 report abnormal tensors only, 0x04 raise on an abnormal tensor, 0x08 abort the process on
one, 0x10 report each tensor's mean, mean of absolute values, min and max. Reports are
``kdbkit warning:`` lines (the user asked for them); the scan copies each tensor to the host,
so it is for debugging, not for speed.
"""

from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from kdbkit.runtime import env
from kdbkit.runtime.backends.base import Backend, Buffer
from kdbkit.runtime.env import CheckNumerics
from kdbkit.runtime.errors import NumericsError
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.tensor import DataType, TensorDesc

_log = get_logger(__name__)


def flags() -> CheckNumerics:
    return CheckNumerics(env.get_int("KDB_CHECK_NUMERICS") or 0)


def as_float32(storage: np.ndarray, dtype: DataType) -> np.ndarray:
    """Elements as float32, whatever the storage (bf16 bits included)."""
    if dtype is DataType.BF16:
        return (storage.astype(np.uint32) << 16).view(np.float32)
    return storage.astype(np.float32)


def _elements(backend: Backend, buffer: Buffer, desc: TensorDesc) -> np.ndarray:
    flat = backend.to_host(buffer, np.empty(desc.span, desc.dtype.storage))
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat, desc.shape, [s * item for s in desc.strides], writeable=False)
    return as_float32(np.ascontiguousarray(view), desc.dtype)


def check(backend: Backend, call: str, stage: str, tensors: Iterable[tuple[str, Buffer, TensorDesc]]) -> None:
    """Check each tensor of ``call`` (``stage`` is ``input`` or ``output``) as KDB_CHECK_NUMERICS asks.

    Raises:
        NumericsError: with the throw flag (0x04), naming the first abnormal tensor.
    """
    wanted = flags()
    if not wanted:
        return
    if stage == "output":
        backend.synchronize()
    for name, buffer, desc in tensors:
        values = _elements(backend, buffer, desc)
        findings = [word for word, hit in (("NaN", np.isnan(values).any()), ("inf", np.isinf(values).any()),
                                           ("all zeros", not values.any())) if hit]
        verdict = ", ".join(findings) if findings else "ok"
        if CheckNumerics.INFO in wanted or (findings and CheckNumerics.WARN in wanted):
            _log.warning("check numerics: %s: %s (%s) %s", call, name, stage, verdict)
        if CheckNumerics.STATS in wanted:
            finite = values[np.isfinite(values)]
            if finite.size:
                _log.warning("check numerics: %s: %s (%s) mean %.6g, absmean %.6g, min %.6g, max %.6g", call, name,
                             stage, finite.mean(), np.abs(finite).mean(), finite.min(), finite.max())
        if findings and CheckNumerics.ABORT in wanted:
            _log.critical("check numerics: %s: %s (%s) %s; aborting (KDB_CHECK_NUMERICS has 0x08)", call, name,
                          stage, verdict)
            os.abort()
        if findings and CheckNumerics.THROW in wanted:
            raise NumericsError(f"{call}: {stage} {name} has {verdict}",
                                "find where it comes from, or unset KDB_CHECK_NUMERICS's 0x04 bit")
