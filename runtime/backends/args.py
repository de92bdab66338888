"""Kernel launch arguments: the one rule for what a launch accepts, shared by every backend.

A launch takes device buffers and NumPy scalars. The scalar's dtype fixes the width the
kernel receives (``np.int32(n)`` for an ``int`` parameter, ``np.float32(a)`` for ``float``);
plain Python numbers are refused because their width would be a guess, and a wrong guess
shifts every later parameter without any error from the driver. A backend that declares the
``param_blocks`` capability (CUDA) also takes a :class:`ParamBlock`: a struct passed by value,
such as the 128-byte tensor map a TMA kernel declares as a ``__grid_constant__`` parameter.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from kdbkit.runtime.backends.base import Buffer
from kdbkit.runtime.errors import LaunchArgumentError, TransferError


@dataclass(frozen=True)
class ParamBlock:
    """A kernel parameter passed by value as raw bytes: a struct the kernel declares, such as a
    ``CUtensorMap`` (128 bytes, 64-byte aligned) taken as a ``__grid_constant__`` parameter.

    Attributes:
        data: the struct's bytes, exactly as the kernel's parameter holds them.
        align: its alignment, a power of two from 8 to 256: the driver places each parameter
            by the kernel's own layout, and the host copy is aligned the same way.
    """

    data: bytes
    align: int = 8

    def __post_init__(self) -> None:
        if self.align < 8 or self.align > 256 or self.align & (self.align - 1):
            raise LaunchArgumentError(f"a parameter block's alignment must be a power of two in 8..256, "
                                      f"not {self.align}")
        if not self.data:
            raise LaunchArgumentError("a parameter block holds no bytes")


def check_launch_args(kernel_name: str, args: Sequence[Any], buffer_type: type[Buffer], *,
                      blocks: bool = False) -> None:
    """Refuse arguments a backend cannot pass with a known width.

    Args:
        kernel_name: for the message.
        args: the launch arguments.
        buffer_type: the backend's own buffer class (a buffer of another backend is refused).
        blocks: whether the backend passes :class:`ParamBlock` arguments (``param_blocks``).

    Raises:
        LaunchArgumentError: naming the argument's position, its type and the fix.
    """
    for i, arg in enumerate(args):
        if isinstance(arg, buffer_type):
            if getattr(arg, "freed", False):
                raise LaunchArgumentError(f"{kernel_name}: argument {i} is a buffer that was already freed")
            continue
        if isinstance(arg, ParamBlock):
            if not blocks:
                raise LaunchArgumentError(f"{kernel_name}: argument {i} is a {len(arg.data)}-byte parameter block, "
                                          "which only a backend with the param_blocks capability (CUDA) passes")
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


def pack_launch_slots(args: Sequence[Any], buffer_type: type[Buffer]) -> tuple[ctypes.Array, list[int]]:
    """Every argument in its own slot of one C buffer, for drivers that take a pointer to each
    value: a buffer's device address or a scalar's bytes in 8 bytes from the slot's start, a
    :class:`ParamBlock`'s bytes in a slot of its size rounded up to 8 and aligned as it asks.

    Returns:
        The buffer and each argument's byte offset in it (every offset a multiple of 8).

    Raises:
        LaunchArgumentError: a scalar wider than 8 bytes.
    """
    # The slots' bytes joined first, then copied in one move: a copy per argument cost more than
    # the rest of the packing together.
    pieces, offsets, end, widest = [], [], 0, 8
    for i, a in enumerate(args):
        if isinstance(a, buffer_type):
            raw, align = int(a.ptr).to_bytes(8, "little"), 8
        elif isinstance(a, ParamBlock):
            raw, align = a.data, a.align
            widest = max(widest, align)
        else:
            raw, align = a.tobytes(), 8
            if len(raw) > 8:
                raise LaunchArgumentError(f"argument {i} is a {len(raw)}-byte {a.dtype} scalar; kernels take at most 8")
        gap = -end % align
        if gap:
            pieces.append(bytes(gap))
            end += gap
        offsets.append(end)
        pieces.append(raw)
        end += len(raw)
        if end % 8:
            pieces.append(bytes(-end % 8))
            end += -end % 8
    # ctypes aligns its buffers to 16 at most: ask for `widest` more and start where it is aligned.
    holder = ctypes.create_string_buffer(max(end, 8) + widest)
    shift = -ctypes.addressof(holder) % widest
    ctypes.memmove(ctypes.addressof(holder) + shift, b"".join(pieces), end)
    return holder, [shift + offset for offset in offsets]


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
