"""A primitive call's tensors on the device: NumPy arrays copied in and back, device tensors used in place.

A NumPy input is copied to a packed device buffer (so its problem is a packed one), a NumPy
or missing output gets a packed device buffer that is copied back at the end, and every
temporary buffer is freed when the call ends, whatever happens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdbkit.runtime import interop
from kdbkit.runtime.backends.base import Backend, Buffer
from kdbkit.runtime.primitives import repeat
from kdbkit.runtime.errors import HandleClosedError, ProblemError
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc, host_array, packed_copy


class Operands:
    """Device buffers for one call; use as a context manager."""

    def __init__(self, backend: Backend):
        if backend.closed:  # every primitive call starts here: one check instead of a raw vendor error later
            raise HandleClosedError()
        self.backend = backend
        self._temporaries: list[Buffer] = []
        self._copy_back: list[tuple[Buffer, np.ndarray]] = []

    def __enter__(self) -> "Operands":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:
                for buffer, out in self._copy_back:
                    self.backend.to_host(buffer, out)
        finally:
            for buffer in self._temporaries:
                buffer.free()

    def input(self, value: Any, dtype: DataType | str | None, what: str) -> tuple[Buffer, TensorDesc]:
        """The buffer and descriptor of an input tensor.

        Raises:
            ProblemError: not a NumPy array or device tensor, or an unsupported type.
        """
        if isinstance(value, DeviceTensor) or interop.is_foreign_device_tensor(value):
            buffer, desc = (value.buffer, value.desc) if isinstance(value, DeviceTensor) else \
                interop.wrap(value, self.backend, what)
            if dtype is not None and DataType.parse(dtype) is not desc.dtype:
                raise ProblemError(f"{what} holds {desc.dtype.label} elements but dtype={dtype} was asked for",
                                   "pass the matching dtype")
            repeat.note_buffer(buffer, what, value)
            return buffer, desc
        host, desc = host_array(interop.host_view(value), dtype, what)
        host = packed_copy(host, self.backend, what)
        buffer = self.backend.to_device(host)
        self._temporaries.append(buffer)
        return buffer, TensorDesc.packed(desc.dtype, desc.shape)

    def output(self, value: Any, like: TensorDesc, what: str, *, read: bool = False) -> tuple[Buffer, TensorDesc, Any]:
        """The buffer and descriptor an output is written to, and what the call returns.

        ``value`` is ``None`` (a new array shaped ``like`` is returned), a NumPy array (written
        in place), or a device tensor (written on the device). ``read``: the kernel also reads
        the output's old values (a nonzero beta), so a NumPy output is copied in first.

        Raises:
            ProblemError: a shape or type other than ``like``'s.
        """
        if value is None:
            _check_fits(like, self.backend, what)
            value = np.empty(like.shape, like.dtype.storage)
        if isinstance(value, DeviceTensor):
            _same(value.desc, like, what)
            repeat.note_buffer(value.buffer, what, value)
            return value.buffer, value.desc, value
        if interop.is_foreign_device_tensor(value):
            buffer, desc = interop.wrap(value, self.backend, what)
            _same(desc, like, what)
            repeat.note_buffer(buffer, what, value)
            return buffer, desc, value
        value = interop.host_view(value)
        host, desc = host_array(value, like.dtype, what)
        _same(desc, like, what)
        if not (isinstance(value, np.ndarray) and value.flags.c_contiguous and value.flags.writeable):
            raise ProblemError(f"{what} must be a writeable C-contiguous array to be written in place",
                               "pass None to get a new array, or np.ascontiguousarray(...)")
        packed = TensorDesc.packed(like.dtype, like.shape)
        buffer = self.backend.to_device(host) if read else self.backend.alloc(packed.nbytes)
        self._temporaries.append(buffer)
        self._copy_back.append((buffer, host))
        return buffer, packed, value


def _check_fits(desc: TensorDesc, backend: Backend, what: str) -> None:
    """Refuse a new output larger than the device's memory before the host array is made."""
    memory = backend.device.memory_bytes
    if memory and desc.nbytes > memory:
        raise ProblemError(f"{what} ({'x'.join(map(str, desc.shape))}) would be {desc.nbytes} bytes, more than "
                           f"{backend.device.name} holds ({memory} bytes)", "make the problem smaller")


def _same(desc: TensorDesc, like: TensorDesc, what: str) -> None:
    if desc.shape != like.shape or desc.dtype is not like.dtype:
        raise ProblemError(f"{what} is {desc.dtype.label} {'x'.join(map(str, desc.shape))} but must be "
                           f"{like.dtype.label} {'x'.join(map(str, like.shape))}", f"pass {what} of that shape and type")


def device_default(handle, out: Any, like_input: Any, desc: TensorDesc, *, keep_strides: bool = False) -> Any:
    """A missing output of a device-tensor call is a new device tensor (a NumPy call gets a NumPy
    array), packed, or laid out as ``desc`` with ``keep_strides`` (a channels-last convolution's)."""
    if out is None and type(like_input) is np.ndarray and like_input.ndim == 0 and desc.shape == (1,):
        return np.empty((), desc.dtype.storage)  # a 0-d input gets a 0-d output, not shape (1,)
    made = desc if keep_strides else TensorDesc.packed(desc.dtype, desc.shape)
    if out is None and isinstance(like_input, DeviceTensor):
        return DeviceTensor.empty(handle.backend, made)
    if out is None and interop.is_foreign_device_tensor(like_input):
        out = interop.empty_like(like_input, made)
        repeat.note_new(out, like_input, made)  # a repeat call makes it the same way
    return out
