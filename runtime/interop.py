"""PyTorch and CuPy tensors used in place on the CUDA backend: no copies, the caller's memory.

A CUDA tensor of either library becomes a non-owning device buffer of the handle's backend
(its pointer, strides in elements, type) and a primitive reads and writes it where it is. A
PyTorch tensor is read through its own attributes (``data_ptr``, ``stride``, ``dtype``: this
also covers bfloat16, which ``__cuda_array_interface__`` cannot describe); anything else with
``__cuda_array_interface__`` (CuPy, Numba) through that. A tensor on the CPU is treated as a
NumPy array; one on another GPU, or given to a backend that is not CUDA, is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.tensor import DataType, TensorDesc

_TORCH_TYPES = {"torch.float32": DataType.FP32, "torch.float16": DataType.FP16, "torch.bfloat16": DataType.BF16}
_INTERFACE_TYPES = {"<f4": DataType.FP32, "<f2": DataType.FP16}


def is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def is_foreign_device_tensor(value: Any) -> bool:
    """A CUDA tensor of PyTorch, CuPy or another ``__cuda_array_interface__`` library."""
    if is_torch(value):
        return bool(value.is_cuda)
    return hasattr(value, "__cuda_array_interface__")


def host_view(value: Any) -> Any:
    """A CPU PyTorch tensor as a NumPy array (bf16 as its bits); anything else unchanged."""
    if is_torch(value) and not value.is_cuda:
        if str(value.dtype) == "torch.bfloat16":
            import torch

            return value.contiguous().view(torch.int16).numpy().view(np.uint16)
        return value.numpy()
    return value


def wrap(value: Any, backend, what: str) -> tuple[Any, TensorDesc]:
    """The caller's CUDA tensor as (non-owning buffer, descriptor).

    Raises:
        ProblemError: the backend is not CUDA, the tensor is on another device, or its type is
            not fp32/fp16/bf16.
    """
    if "wrap" not in backend.capabilities:
        raise ProblemError(f"{what} is a CUDA tensor but this handle's device is {backend.device.name} "
                           f"({backend.name})", "copy it to the host (.cpu()) or use a handle on that GPU")
    if is_torch(value):
        kind = _TORCH_TYPES.get(str(value.dtype))
        shape, strides, ptr = tuple(value.shape), tuple(value.stride()), value.data_ptr()
        device = value.device.index
    else:
        face = value.__cuda_array_interface__
        kind = _INTERFACE_TYPES.get(face["typestr"])
        shape, ptr = tuple(face["shape"]), face["data"][0]
        item = int(face["typestr"][2:])
        strides = tuple(s // item for s in face["strides"]) if face.get("strides") else None
        device = getattr(getattr(value, "device", None), "id", backend.device.index)
    if kind is None:
        raise ProblemError(f"{what} holds {getattr(value, 'dtype', '?')} elements", "use fp32, fp16 or bf16 tensors")
    if device is not None and device != backend.device.index:
        raise ProblemError(f"{what} is on GPU {device}, this handle on GPU {backend.device.index}",
                           "use a handle on the tensor's GPU, or move the tensor")
    desc = TensorDesc(kind, shape or (1,), strides or TensorDesc.packed(kind, shape or (1,)).strides)
    return backend.wrap(ptr, desc.nbytes), desc


def empty_like(value: Any, desc: TensorDesc) -> Any:
    """A new tensor of the caller's library, on its device, laid out as ``desc`` (its strides:
    packed, or a convolution's channels-last), for an output."""
    if is_torch(value):
        import torch

        dtype = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}[desc.dtype]
        if desc.is_packed:
            return torch.empty(desc.shape, dtype=dtype, device=value.device)
        return torch.empty_strided(desc.shape, desc.strides, dtype=dtype, device=value.device)
    import cupy

    if desc.dtype is DataType.BF16:
        raise ProblemError("CuPy has no bfloat16 type for the output", "pass an output tensor, or use PyTorch")
    if desc.is_packed:
        return cupy.empty(desc.shape, dtype=desc.dtype.storage)
    item = desc.dtype.itemsize
    return cupy.lib.stride_tricks.as_strided(cupy.empty(desc.span, dtype=desc.dtype.storage), desc.shape,
                                             tuple(s * item for s in desc.strides))
