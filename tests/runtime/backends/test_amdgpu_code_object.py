"""The AMD code object reader: real clang-19 code objects read back, and every malformed shape refused.

Real objects come from clang with the amdgcn target (skipped without it); the malformed ones
are made by hand (``code_object_builder``) or by cutting and flipping a real one, and must
give :class:`BinaryLoadError`, never a struct, index or key error.
"""

from __future__ import annotations

import struct

import msgpack
import pytest

from kdbkit.runtime.backends.amdgpu_code_object import (
    CodeObject,
    KernelArg,
    code_object_version,
    packed_offsets,
    read_code_object,
)
from kdbkit.runtime.backends.elf_notes import amdgpu_target
from kdbkit.runtime.compilers.amdgcn_clang import compile_amdgcn
from kdbkit.runtime.errors import BinaryLoadError
from kdbkit.runtime.kernel_sources import kernels_dir

from tests.prerequisites import require_amdgcn_clang
from .code_object_builder import kernel_entry, kernel_symbols, make_code_object, metadata

needs_clang = pytest.mark.usefixtures("amdgcn_clang")  # skips without clang-19 (fails in CI)


def _activation(arch: str = "gfx942", *options: str) -> bytes:
    source = (kernels_dir() / "activation.c").read_text()
    return compile_amdgcn(source, arch, ("-I", str(kernels_dir()), *options), name="activation.c")


@pytest.fixture(scope="module")
def activation_gfx942() -> bytes:
    require_amdgcn_clang()
    return _activation()


# ---------------------------------------------------------------- real code objects


@needs_clang
def test_a_clang_code_object_reads_completely(activation_gfx942):
    co = read_code_object(activation_gfx942)
    assert (co.target, co.arch, co.features, co.code_object_version) == ("amdgcn-amd-amdhsa--gfx942", "gfx942", (), 5)
    assert set(co.kernels) == {"relu_fwd", "leaky_relu_fwd"}
    assert {"relu_fwd", "relu_fwd.kd", "leaky_relu_fwd", "leaky_relu_fwd.kd"} <= set(co.defined_symbols)
    assert co.undefined_symbols == ()
    assert {s.table for s in co.symbols} == {".symtab", ".dynsym"}
    kernel = co.kernels["leaky_relu_fwd"]
    assert kernel.symbol == "leaky_relu_fwd.kd"
    assert kernel.explicit_args == (
        KernelArg(0, 8, "global_buffer", None, "global"),
        KernelArg(8, 8, "global_buffer", None, "global"),
        KernelArg(16, 4, "by_value"),
        KernelArg(20, 4, "by_value"),
    )
    assert len(kernel.args) > 4 and all(a.value_kind.startswith("hidden_") for a in kernel.args[4:])
    assert [a.offset for a in kernel.explicit_args] == packed_offsets([a.size for a in kernel.explicit_args])
    assert kernel.wavefront_size == 64 and kernel.group_segment_fixed_size == 0
    assert kernel.kernarg_segment_size >= 24 and kernel.kernarg_segment_align == 8
    assert kernel.max_flat_workgroup_size == 1024 and kernel.sgpr_count > 0 and kernel.vgpr_count > 0
    assert kernel.private_segment_fixed_size == 0


@needs_clang
def test_target_features_and_wave32():
    co = read_code_object(_activation("gfx90a:xnack-"))
    assert (co.target, co.arch, co.features) == ("amdgcn-amd-amdhsa--gfx90a:xnack-", "gfx90a", ("xnack-",))
    assert read_code_object(_activation("gfx1100")).kernels["relu_fwd"].wavefront_size == 32


@needs_clang
@pytest.mark.parametrize("version", [4, 5, 6])
def test_code_object_version_comes_from_the_abi_version(version):
    # v6 carries v5's amdhsa.version [1, 2]: only EI_ABIVERSION (4) tells them apart.
    blob = _activation("gfx942", f"-mcode-object-version={version}")
    assert blob[8] == version - 2
    assert read_code_object(blob).code_object_version == code_object_version(blob) == version
    assert code_object_version(blob[:64]) == version  # the header alone: what preflight reads


@needs_clang
def test_elf_notes_reads_the_target_with_the_msgpack_decoder(activation_gfx942):
    assert amdgpu_target(activation_gfx942) == ("gfx942", ())


@needs_clang
def test_every_cut_and_every_flipped_byte_is_a_binary_load_error_or_a_code_object(activation_gfx942):
    blob = activation_gfx942
    for size in range(len(blob)):
        with pytest.raises(BinaryLoadError):
            read_code_object(blob[:size])
    for at in range(len(blob)):
        damaged = bytearray(blob)
        damaged[at] ^= 0xFF
        try:
            assert isinstance(read_code_object(bytes(damaged)), CodeObject)
        except BinaryLoadError:
            pass


# ---------------------------------------------------------------- hand-made code objects


def test_a_hand_made_code_object_reads():
    meta = metadata(kernel_entry("a"), kernel_entry("b", wavefront_size=32))
    co = read_code_object(make_code_object(meta, kernel_symbols("a", "b") + [("ext", 0, 0)]))
    assert set(co.kernels) == {"a", "b"} and co.kernels["b"].wavefront_size == 32
    assert co.undefined_symbols == ("ext",) and co.defined_symbols == ("a", "a.kd", "b", "b.kd")


def test_missing_optional_keys_are_none():
    entry = {".name": "k", ".symbol": "k.kd"}  # no .args and no counts
    kernel = read_code_object(make_code_object(metadata(entry))).kernels["k"]
    assert kernel.args == () and kernel.explicit_args == ()
    assert kernel.wavefront_size is kernel.group_segment_fixed_size is kernel.kernarg_segment_size is None


def _patched(blob: bytes, *fields: tuple[int, str, int]) -> bytes:
    """``blob`` with each (offset, struct format, value) written over it."""
    data = bytearray(blob)
    for at, fmt, value in fields:
        struct.pack_into(fmt, data, at, value)
    return bytes(data)


def _section_type(blob: bytes, index: int, sh_type: int) -> bytes:
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    return _patched(blob, (shoff + index * 64 + 4, "<I", sh_type))


GOOD = make_code_object()
(_SHOFF,) = struct.unpack_from("<Q", GOOD, 0x28)


MALFORMED = [
    (b"", "not an ELF file"),
    (b"garbage " * 20, "not an ELF file"),
    (b"\x7fELF\x02\x01" + bytes(58), "machine 0, not an AMD GPU code object"),
    (make_code_object(machine=190), "machine 190, not an AMD GPU code object"),
    (make_code_object(osabi=0), "not a 64-bit HSA code object"),
    (_patched(GOOD, (4, "<B", 1)), "not a 64-bit HSA code object"),
    (_patched(GOOD, (5, "<B", 2)), "big-endian"),
    (make_code_object(abi_version=9), "EI_ABIVERSION 9"),
    (_patched(GOOD, (0x28, "<Q", 0)), "no section table"),
    (_patched(GOOD, (0x28, "<Q", 1 << 40)), "truncated: its 4 section headers"),
    (_patched(GOOD, (0x3A, "<H", 40)), "section headers are 40 bytes"),
    (GOOD[: len(GOOD) - 10], "truncated"),
    (_section_type(GOOD, 2, 1), "no symbol table"),  # .dynsym made PROGBITS
    (_section_type(GOOD, 1, 1), "no NT_AMDGPU_METADATA note"),  # the note section made PROGBITS
    (_patched(GOOD, (_SHOFF + 2 * 64 + 56, "<Q", 16)), "dynsym has 72 bytes of 16-byte entries"),
    (_patched(GOOD, (_SHOFF + 2 * 64 + 40, "<I", 1)), "dynsym links to section 1, not a string table"),
    (_patched(GOOD, (_SHOFF + 1 * 64 + 32, "<Q", 1 << 20)), "section 1 \\(type 7"),
    (make_code_object(note_owner=b"AMD"), "no NT_AMDGPU_METADATA note"),
    (make_code_object(note_type=1), "no NT_AMDGPU_METADATA note"),
    (make_code_object(b"\xc1garbage", symbols=[]), "not MessagePack"),
    (make_code_object(msgpack.packb({"a": 1}) + b"\x01", symbols=[]), "not MessagePack.*ExtraData"),
    (make_code_object(msgpack.packb([1, 2]), symbols=[]), "metadata is a list, not a map"),
    (make_code_object({**metadata(), "amdhsa.version": [1]}), "amdhsa.version is \\[1\\]"),
    (make_code_object(metadata(version=(1, 1))), "amdhsa.version \\[1, 1\\] does not belong to code object v5"),
    (make_code_object(metadata(version=(1, 2)), abi_version=2), "\\[1, 2\\] does not belong to code object v4"),
    (make_code_object(metadata(target="gfx942")), "amdhsa.target is 'gfx942'"),
    (make_code_object(metadata(target="amdgcn-amd-amdhsa--gfx942:xnack")), "unreadable amdhsa.target"),
    (make_code_object({**metadata(), "amdhsa.kernels": {}}), "amdhsa.kernels is a dict, not a list"),
    (make_code_object({**metadata(), "amdhsa.kernels": [3]}, symbols=[]), "amdhsa.kernels\\[0\\] is a int"),
    (make_code_object(metadata(kernel_entry("k"), kernel_entry("k"))), "two kernels are named 'k'"),
    (make_code_object(metadata({".symbol": "k.kd"}), symbols=[]), "amdhsa.kernels\\[0\\] has no .name"),
    (make_code_object(metadata(kernel_entry(symbol=None))), "\\(k\\) has no .symbol"),
    (make_code_object(metadata(kernel_entry(wavefront_size=True))), ".wavefront_size is True, not a non-neg"),
    (make_code_object(metadata(kernel_entry(vgpr_count=-1))), ".vgpr_count is -1"),
    (make_code_object(metadata({**kernel_entry(), ".args": "x"})), ".args is a str, not a list"),
    (make_code_object(metadata(kernel_entry(args=[(0, 8, 5)]))), ".args\\[0\\]: .value_kind is 5, not a string"),
    (make_code_object(metadata(kernel_entry(args=[(0, None, "by_value")]))), ".args\\[0\\] has no .size"),
]


@pytest.mark.parametrize("blob, match", MALFORMED, ids=[match for _, match in MALFORMED])
def test_malformed_code_objects_are_binary_load_errors(blob, match):
    with pytest.raises(BinaryLoadError, match=match) as info:
        read_code_object(blob, what="k.co")
    assert "\n" not in str(info.value) and info.value.remedy


def test_a_symbol_name_outside_its_string_table_is_refused():
    dynstr_at = GOOD.index(b"\0k\0k.kd\0")  # .dynsym (null, k, k.kd) lies just before its strings
    blob = _patched(GOOD, (dynstr_at - 2 * 24, "<I", 10_000))
    with pytest.raises(BinaryLoadError, match="dynsym symbol 1: its name at 10000 is outside its string table"):
        read_code_object(blob)


# ---------------------------------------------------------------- hip-python's packing rule


@pytest.mark.parametrize(
    "sizes, offsets",
    [
        ([8, 8, 4, 4], [0, 8, 16, 20]),  # leaky_relu_fwd: ptr, ptr, int, float
        ([4, 16, 8], [0, 8, 24]),  # a 16-byte vector is aligned to 8, not 16
        ([1, 2, 4, 8], [0, 2, 4, 8]),
        ([1, 8], [0, 8]),
        ([3, 4], [0, 4]),  # a 3-byte struct: aligned to 3 (min(size, 8)), then 4
        ([1, 3], [0, 3]),
        ([4, 12], [0, 8]),
        ([], []),
    ],
)
def test_packed_offsets_follow_hip_python(sizes, offsets):
    assert packed_offsets(sizes) == offsets


def test_packed_offsets_refuse_empty_arguments():
    with pytest.raises(ValueError, match="size 0"):
        packed_offsets([4, 0])
