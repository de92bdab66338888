"""Fixtures and helpers for the primitives' tests, on the lookup-chain device (PoCL in CI)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.chain_fixtures import chain_backend, chain_device, isolated, make_handle  # noqa: F401


@pytest.fixture
def handle(make_handle):  # noqa: F811
    return make_handle()


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even (as the kernels do)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


# (storage of the test's input, how to read results as float32, tolerance) per type
TYPES = {
    "fp32": (lambda a: a.astype(np.float32), lambda a: a, 1e-5),
    "fp16": (lambda a: a.astype(np.float16), lambda a: a.astype(np.float32), 2e-3),
    "bf16": (to_bf16_bits, bf16_to_f32, 1.6e-2),
}
