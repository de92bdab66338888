"""Fixtures and helpers for the primitives' tests, on the lookup-chain device (PoCL in CI)."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from tests.runtime.chain_fixtures import chain_backend, chain_device, isolated, make_handle  # noqa: F401


@pytest.fixture
def handle(make_handle):  # noqa: F811
    return make_handle()


def sm90(cu: int = 132) -> DeviceInfo:
    """An H100's or H200's description, for the sm_90 solvers' gates and choices without the card."""
    return DeviceInfo("cuda", 0, "an sm_90 device", Target.parse(f"sm_90_{cu}"), 80 << 30)


def gpu_with_torch(handle, instruction: str, why: str):
    """(handle, torch) where the handle's device is a CUDA GPU with ``instruction`` (an arch fact:
    ``mma.sync``, ``wgmma``) and PyTorch sees a GPU, else the test skips, saying ``why``."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
    if handle.device.backend != "cuda" or not handle.device.target.arch_facts.has(instruction) \
            or not torch.cuda.is_available():
        pytest.skip(why)
    return handle, torch


@pytest.fixture
def sm90_torch(handle):
    return gpu_with_torch(handle, "wgmma",
                          "the TMA convolution needs an sm_90 GPU (KDB_TEST_BACKEND=cuda on the H100/H200 machine)")


def assert_written_in_place(out, buffer, expected, what: str, memory_format=None) -> None:
    """A GPU result check: the call returned ``buffer`` itself (in ``memory_format``, where
    given), wrote every element of it (it was poisoned with NaN) and came within 1e-2 relative
    of ``expected`` (float64); ``what`` names the case in the failure."""
    assert out.data_ptr() == buffer.data_ptr()
    assert memory_format is None or out.is_contiguous(memory_format=memory_format)
    assert buffer.isfinite().all(), f"{what}: an element was not written"
    err = float((buffer.double() - expected).norm() / expected.norm())
    assert err < 1e-2, f"{what}: relative error {err:.2e}"


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
