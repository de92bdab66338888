"""A problem's tensors for the driver: random host data laid out with the problem's strides.

Each tensor is a flat array of ``desc.span`` elements (its buffer on the device), every element
random at first, gaps between strided elements included; its values are the strided view of
that array. Values are given and returned as float64 and stored rounded to the tensor's type
(bf16 to nearest even, as the kernels round).
"""

from __future__ import annotations

import os

import numpy as np
from numpy.lib.stride_tricks import as_strided

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.tensor import DataType, TensorDesc


def to_storage(values: np.ndarray, dtype: DataType) -> np.ndarray:
    """float values -> the type's storage (bf16: uint16 bits, rounded to nearest even)."""
    if dtype is DataType.BF16:
        u = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.asarray(values).astype(dtype.storage)


def to_float(stored: np.ndarray, dtype: DataType) -> np.ndarray:
    """The type's storage -> float64."""
    if dtype is DataType.BF16:
        return (np.asarray(stored, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(stored, np.float64)


def strided(flat: np.ndarray, desc: TensorDesc, writeable: bool = False) -> np.ndarray:
    """The tensor's elements as a view of its flat buffer."""
    return as_strided(flat, desc.shape, tuple(s * flat.itemsize for s in desc.strides), writeable=writeable)


def check_fits(descs: dict[str, TensorDesc], device_name: str, device_bytes: int) -> None:
    """Refuse, before anything is allocated, tensors the device or this machine cannot hold.

    Args:
        descs: the problem's tensors (name -> descriptor), each held once on the device and,
            as random values, storage and initial copy, on the host.
        device_name, device_bytes: the device and its global memory.

    Raises:
        ProblemError: the tensors need more than the device's global memory, or more than this
            machine's physical memory (where the system says how much it has).
    """
    device_need = sum(d.nbytes for d in descs.values())
    each = ", ".join(f"{name} {_size(d.nbytes)}" for name, d in descs.items())
    if device_need > device_bytes:
        raise ProblemError(f"the problem's tensors need {_size(device_need)} ({each}) and {device_name} has "
                           f"{_size(device_bytes)} of global memory", "give smaller sizes")
    # Per element on the host: the float64 random values the storage is made from, the storage
    # and its initial copy (the reference's float64 arrays come later, output by output).
    host_need = sum(d.span * (8 + 2 * d.dtype.itemsize) for d in descs.values())
    host_bytes = _physical_memory()
    if host_bytes is not None and host_need > host_bytes:
        raise ProblemError(f"the driver needs about {_size(host_need)} of host memory for the problem's tensors "
                           f"({each}) and this machine has {_size(host_bytes)}", "give smaller sizes")


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def _size(n: float) -> str:
    """``2.9 TiB``; sizes past PiB in PiB with an exponent (a mistyped -n can ask for 10^20 elements)."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    n /= 1024
    return f"{n:.1f} PiB" if n < 1e5 else f"{n:.3g} PiB"


class HostTensors:
    """Host copies of a problem's tensors (name -> flat storage), with their initial contents."""

    def __init__(self, descs: dict[str, TensorDesc], rng: np.random.Generator):
        self.descs = dict(descs)
        self.flat = {name: to_storage(rng.standard_normal(d.span), d.dtype) for name, d in self.descs.items()}
        self.initial = {name: flat.copy() for name, flat in self.flat.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        """The tensor's current values, float64, in its shape."""
        desc = self.descs[name]
        return to_float(strided(self.flat[name], desc), desc.dtype)

    def set(self, name: str, values: np.ndarray) -> np.ndarray:
        """Store ``values`` (rounded to the type) as the tensor's elements; return them as stored."""
        desc = self.descs[name]
        view = strided(self.flat[name], desc, writeable=True)
        view[...] = to_storage(np.broadcast_to(np.asarray(values, np.float64).reshape(desc.shape), desc.shape),
                               desc.dtype)
        self.initial[name] = self.flat[name].copy()
        return self[name]

    def values_of(self, name: str, flat: np.ndarray) -> np.ndarray:
        """Another flat copy of ``name`` (read back from the device) as float64 values."""
        desc = self.descs[name]
        return to_float(strided(flat, desc), desc.dtype)

    def gaps_changed(self, name: str, flat: np.ndarray) -> int:
        """How many elements between the tensor's strided elements differ from what was there."""
        desc = self.descs[name]
        covered = np.zeros(desc.span, bool)
        covered[strided(np.arange(desc.span), desc).ravel()] = True
        return int(np.count_nonzero(flat[~covered] != self.initial[name][~covered]))
