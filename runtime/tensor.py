"""Tensor descriptors, and the arrays primitives take: NumPy arrays on the host, tensors on the device.

A :class:`TensorDesc` is what a problem records of a tensor: element type, shape and element
strides. Sizes and strides are launch arguments of every kernel, never compile options, so a
descriptor only ever picks a program through its type.

Types: ``fp32``, ``fp16`` and ``bf16``. NumPy has no bfloat16: a bf16 tensor is given as a
``uint16`` array of its bits with ``dtype="bf16"``, or as an ``ml_dtypes.bfloat16`` array.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from kdbkit.runtime.backends.base import Backend, Buffer
from kdbkit.runtime.errors import ProblemError


class DataType(enum.Enum):
    """An element type: its name in config strings, its NumPy storage and its compile option."""

    FP32 = ("fp32", np.float32, ())
    FP16 = ("fp16", np.float16, ("-DKDB_TYPE_FP16",))
    BF16 = ("bf16", np.uint16, ("-DKDB_TYPE_BF16",))

    def __init__(self, label: str, storage: type, options: tuple[str, ...]):
        self.label = label
        self.storage = np.dtype(storage)
        self.options = options

    # Members are singletons: identity's hash, in C, instead of Enum's hash of the name in
    # Python; a type is hashed in every descriptor of every repeat call's plan key.
    __hash__ = object.__hash__

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @classmethod
    def parse(cls, value: "str | DataType | np.dtype | type") -> "DataType":
        """``"fp16"``, ``np.float16``, a DataType, ...

        Raises:
            ProblemError: a type no primitive supports.
        """
        if isinstance(value, DataType):
            return value
        if isinstance(value, str):
            for member in cls:
                if value.lower() in (member.label, member.name.lower()):
                    return member
        else:
            try:
                dtype = np.dtype(value)
            except TypeError:
                dtype = None
            if dtype is not None:
                if dtype.name == "bfloat16":  # ml_dtypes
                    return cls.BF16
                for member in (cls.FP32, cls.FP16):
                    if dtype == member.storage:
                        return member
        raise ProblemError(f"unsupported data type {value!r}",
                           "use fp32, fp16 or bf16 (bf16 as a uint16 array of its bits with dtype='bf16')")


def packed_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous tensor of this shape."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def format_dims(values: Sequence[int]) -> str:
    """``(2, 3, 4)`` -> ``"2x3x4"``, the form config strings use."""
    return "x".join(str(int(v)) for v in values)


# The largest magnitude a size, stride or count in a config string may have: beyond it no
# tensor fits any memory, and products of such sizes would overflow 64-bit index arithmetic.
MAX_CONFIG_INT = 2 ** 62
# Digits (with a sign) read at most: a longer text is refused before Python parses thousands of digits.
_MAX_INT_CHARS = 20


def parse_int(text: str, what: str) -> int:
    """A config string's integer, at most :data:`MAX_CONFIG_INT` in magnitude.

    Raises:
        ProblemError: not a whole number, or too large to be a size.
    """
    stripped = text.strip()
    if len(stripped) > _MAX_INT_CHARS:
        raise ProblemError(f"{what} {stripped[:24]!r}... is {len(stripped)} characters long, not a size",
                           f"write {what} as a whole number below 2**62")
    try:
        number = int(stripped)
    except ValueError:
        raise ProblemError(f"{what} {text!r} is not an integer", f"write {what} as a whole number") from None
    if abs(number) > MAX_CONFIG_INT:
        raise ProblemError(f"{what} {number} is larger than any size (2**62)", f"write {what} as a whole number below 2**62")
    return number


def parse_dims(text: str, what: str) -> tuple[int, ...]:
    """``"2x3x4"`` -> ``(2, 3, 4)``.

    Raises:
        ProblemError: not integers separated by ``x``, or a size beyond :data:`MAX_CONFIG_INT`.
    """
    try:
        return tuple(parse_int(part, what) for part in text.split("x"))
    except ProblemError as exc:
        raise ProblemError(f"{what} {text[:80]!r} is not sizes separated by 'x' ({exc.problem})",
                           "write it as e.g. 2x3x4x5") from None


@dataclass(frozen=True)
class TensorDesc:
    """A tensor's element type, shape and element strides.

    Raises (on construction):
        ProblemError: an empty shape, a size below 1, strides of another rank or negative.
    """

    dtype: DataType
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:
        # min(), not any() over a generator: descriptors are made on every call's full path
        if not self.shape:
            raise ProblemError("a tensor needs at least one dimension", "give its shape")
        if min(self.shape) < 1:
            raise ProblemError(f"shape {format_dims(self.shape)} has a size below 1", "every size must be >= 1")
        if len(self.strides) != len(self.shape):
            raise ProblemError(f"strides {format_dims(self.strides)} do not match shape {format_dims(self.shape)}",
                               "give one stride per dimension")
        if min(self.strides) < 0:
            raise ProblemError(f"strides {format_dims(self.strides)} include a negative one",
                               "reverse the tensor on the host (np.ascontiguousarray) first")

    @functools.cached_property
    def key(self) -> tuple:
        """(dtype, shape, strides): equal for equal descriptors, and hashed in C (a repeat
        call's plan key holds one per tensor; the dataclass's own hash is a Python call)."""
        return self.dtype, self.shape, self.strides

    @classmethod
    def packed(cls, dtype: DataType | str, shape: Sequence[int]) -> "TensorDesc":
        shape = tuple(int(s) for s in shape)
        return cls(DataType.parse(dtype), shape, packed_strides(shape))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_packed(self) -> bool:
        """Elements laid out one after another in C order (size-1 dimensions' strides ignored)."""
        expected = packed_strides(self.shape)
        return all(size == 1 or s == e for size, s, e in zip(self.shape, self.strides, expected))

    @property
    def span(self) -> int:
        """Elements from the first to one past the last: how much memory the tensor reaches."""
        return 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.strides))

    @property
    def nbytes(self) -> int:
        return self.span * self.dtype.itemsize


def host_array(value: Any, dtype: DataType | str | None, what: str) -> tuple[np.ndarray, TensorDesc]:
    """A NumPy argument as (array viewed in its storage type, descriptor with element strides).

    Raises:
        ProblemError: not an array, an unsupported type, or a type that contradicts ``dtype``.
    """
    if not isinstance(value, np.ndarray):
        raise ProblemError(f"{what} is a {type(value).__name__}, not a NumPy array or a device tensor",
                           "pass a NumPy array, or a DeviceTensor from handle.to_device()")
    given = DataType.parse(dtype) if dtype is not None else None
    if value.dtype.name == "bfloat16" or (given is DataType.BF16 and value.dtype == np.uint16):
        kind = DataType.BF16
        value = value.view(np.uint16)
    else:
        kind = DataType.parse(value.dtype)
    if given is not None and given is not kind:
        raise ProblemError(f"{what} holds {kind.label} elements but dtype={given.label} was asked for",
                           "convert the array, or pass the matching dtype")
    if any(s % value.itemsize for s in value.strides) or any(s < 0 for s in value.strides):
        value = np.ascontiguousarray(value)
    strides = tuple(s // value.itemsize for s in value.strides)
    return value, TensorDesc(kind, tuple(value.shape) or (1,), strides or (1,))


def _size(nbytes: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def packed_copy(host: np.ndarray, backend: Backend, what: str) -> np.ndarray:
    """``host`` made C-contiguous for the device, refused first if that copy cannot fit.

    A broadcast (stride-0) array is small on the host but is copied packed, element by
    element: ``np.broadcast_to`` of one number to 10^12 elements would ask for terabytes.

    Raises:
        ProblemError: the packed copy is larger than the device's memory (or than the host
            can allocate), naming ``what`` and the bytes.
    """
    if host.flags.c_contiguous:
        return host
    nbytes = host.size * host.itemsize
    memory = backend.device.memory_bytes
    remedy = (f"pass a smaller {what}; a broadcast (stride-0) array is copied in full, so pass the array before "
              "broadcasting where the primitive broadcasts (op_tensor's b), or a device tensor")
    if memory and nbytes > memory:
        raise ProblemError(f"{what} ({format_dims(host.shape)}) is {nbytes} bytes ({_size(nbytes)}) packed, more "
                           f"than {backend.device.name} holds ({_size(memory)})", remedy)
    try:
        return np.ascontiguousarray(host)
    except MemoryError:
        raise ProblemError(f"{what} ({format_dims(host.shape)}) is {nbytes} bytes ({_size(nbytes)}) packed, more "
                           "than this host can allocate", remedy) from None


@dataclass
class DeviceTensor:
    """A tensor in device memory: a backend buffer and its descriptor."""

    buffer: Buffer
    desc: TensorDesc

    @classmethod
    def from_host(cls, backend: Backend, array: np.ndarray, dtype: DataType | str | None = None) -> "DeviceTensor":
        """Copy a NumPy array to the device (packed)."""
        host, desc = host_array(array, dtype, "the array")
        host = packed_copy(host, backend, "the array")
        return cls(backend.to_device(host), TensorDesc.packed(desc.dtype, host.shape or (1,)))

    @classmethod
    def empty(cls, backend: Backend, desc: TensorDesc) -> "DeviceTensor":
        return cls(backend.alloc(desc.nbytes), desc)

    def to_host(self, backend: Backend) -> np.ndarray:
        """Copy back a packed tensor (``uint16`` bits for bf16)."""
        if not self.desc.is_packed:
            raise ProblemError("only a packed device tensor can be copied back as one array",
                               "copy the buffer with backend.to_host and index it with the strides")
        out = np.empty(self.desc.shape, self.desc.dtype.storage)
        return backend.to_host(self.buffer, out)
