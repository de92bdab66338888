"""Kernel launch arguments: the one rule for what a launch accepts, shared by every backend.

A launch takes device buffers and NumPy scalars. The scalar's dtype fixes the width the
kernel receives (``np.int32(n)`` for an ``int`` parameter, ``np.float32(a)`` for ``float``);
plain Python numbers are refused because their width would be a guess, and a wrong guess
shifts every later parameter without any error from the driver.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from kdbkit.runtime.backends.base import Buffer
from kdbkit.runtime.errors import LaunchArgumentError, TransferError


def check_launch_args(kernel_name: str, args: Sequence[Any], buffer_type: type[Buffer]) -> None:
    """Refuse arguments a backend cannot pass with a known width.

    Args:
        kernel_name: for the message.
        args: the launch arguments.
        buffer_type: the backend's own buffer class (a buffer of another backend is refused).

    Raises:
        LaunchArgumentError: naming the argument's position, its type and the fix.
    """
    for i, arg in enumerate(args):
        if isinstance(arg, buffer_type):
            if getattr(arg, "freed", False):
                raise LaunchArgumentError(f"{kernel_name}: argument {i} is a buffer that was already freed")
            continue
        if isinstance(arg, Buffer):
            raise LaunchArgumentError(
                f"{kernel_name}: argument {i} is a {type(arg).__name__} from another backend; "
                f"allocate it with this backend ({buffer_type.__name__})"
            )
        if isinstance(arg, np.generic) and arg.dtype.kind in "biuf":
            continue
        hint = "np.int32(...)" if isinstance(arg, (bool, int)) else "np.float32(...)"
        raise LaunchArgumentError(
            f"{kernel_name}: argument {i} is {type(arg).__name__} {arg!r}; pass a device buffer or a NumPy "
            f"scalar whose dtype matches the kernel parameter, e.g. {hint}"
        )


def pack_launch_slots(args: Sequence[Any], buffer_type: type[Buffer]) -> ctypes.Array:
    """Every argument in its own 8-byte slot of one C buffer: a buffer's device address, or a
    scalar's bytes from the slot's start (for drivers that take a pointer to each value).

    Raises:
        LaunchArgumentError: a scalar wider than 8 bytes.
    """
    slots = []
    for i, a in enumerate(args):
        if isinstance(a, buffer_type):
            slots.append(int(a.ptr).to_bytes(8, "little"))
            continue
        raw = a.tobytes()
        if len(raw) > 8:
            raise LaunchArgumentError(f"argument {i} is a {len(raw)}-byte {a.dtype} scalar; kernels take at most 8")
        slots.append(raw.ljust(8, b"\0"))
    raw = b"".join(slots)
    return ctypes.create_string_buffer(raw, max(len(raw), 8))


def scalar_ctype(value: np.generic) -> Any:
    """Return the scalar as a ctypes value of the same width (float16 travels as its bits)."""
    if value.dtype == np.float16:
        return ctypes.c_uint16(int(np.asarray(value).view(np.uint16)))
    if value.dtype == np.bool_:
        return ctypes.c_bool(bool(value))
    return np.ctypeslib.as_ctypes_type(value.dtype)(value.item())


def check_host_out(out: np.ndarray, nbytes: int, device_name: str) -> None:
    """Check that ``out`` can receive a copy of up to ``nbytes`` bytes from a device buffer.

    Raises:
        TransferError: ``out`` is not a writeable C-contiguous array, or larger than the buffer.
    """
    if not isinstance(out, np.ndarray) or not (out.flags.c_contiguous and out.flags.writeable):
        raise TransferError(f"copy from {device_name}: the output must be a writeable C-contiguous NumPy array")
    if out.nbytes > nbytes:
        raise TransferError(
            f"copy from {device_name}: the output array has {out.nbytes} bytes but the buffer only {nbytes}"
        )
