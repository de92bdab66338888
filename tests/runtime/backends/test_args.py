"""Launch arguments: the one rule every backend applies, and the CUDA backend's packing of them
into parameter slots, a by-value struct (a TMA tensor map: 128 bytes, 64-byte aligned) among them."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kdbkit.runtime.backends.args import ParamBlock, check_launch_args, pack_launch_slots
from kdbkit.runtime.backends.base import Buffer
from kdbkit.runtime.errors import LaunchArgumentError


class FakeBuffer(Buffer):
    def __init__(self, ptr: int):
        self.ptr, self.nbytes, self.freed = ptr, 64, False


def test_a_struct_gets_a_slot_of_its_size_aligned_as_it_asks():
    block = ParamBlock(bytes(range(128)), 64)
    args = [np.int32(7), block, FakeBuffer(0x1234_5678_9ABC), np.float32(1.5), ParamBlock(b"\1\2\3", 8)]
    holder, offsets = pack_launch_slots(args, FakeBuffer)
    base = ctypes.addressof(holder)
    assert [(base + o) % 64 == 0 for o in offsets[1:2]] == [True]  # the struct's own address, host side too
    assert offsets[2] - offsets[1] == 128 and offsets[3] - offsets[2] == 8 and offsets[4] - offsets[3] == 8
    assert all(o % 8 == 0 for o in offsets) and offsets == sorted(offsets)
    read = lambda i, n: ctypes.string_at(base + offsets[i], n)  # noqa: E731
    assert read(0, 4) == np.int32(7).tobytes() and read(1, 128) == bytes(range(128))
    assert read(2, 8) == (0x1234_5678_9ABC).to_bytes(8, "little") and read(3, 4) == np.float32(1.5).tobytes()
    assert read(4, 3) == b"\1\2\3"


def test_only_a_backend_that_passes_structs_takes_one():
    block = ParamBlock(bytes(128), 64)
    check_launch_args("k", [block, np.int32(1)], FakeBuffer, blocks=True)
    with pytest.raises(LaunchArgumentError, match="argument 0 is a 128-byte parameter block.*param_blocks"):
        check_launch_args("k", [block], FakeBuffer)
    for bad in (dict(data=b"", align=8), dict(data=b"x", align=4), dict(data=b"x", align=48)):
        with pytest.raises(LaunchArgumentError):
            ParamBlock(**bad)


def test_a_scalar_wider_than_a_slot_is_refused():
    with pytest.raises(LaunchArgumentError, match="16-byte complex128 scalar"):
        pack_launch_slots([np.complex128(1)], FakeBuffer)
