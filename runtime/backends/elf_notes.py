"""Read the target arch out of a GPU binary's ELF header and notes, without any vendor library.

Backends call this before handing a binary to the driver, so that a binary built for another
arch is refused with a clear error instead of crashing or silently misbehaving.

CUDA cubins (``e_machine == 190``, EM_CUDA). The SM number (major * 10 + minor) sits in
``e_flags``, at a place that depends on the cubin ABI version (``e_ident[EI_ABIVERSION]``):

====================  ============================  =============================
ABI version           SM field                      seen
====================  ============================  =============================
7 (CUDA <= 12.x)      bits 0-7  (``EF_CUDA_SM``),   sm_70: 0x00460546
                      virtual arch in bits 16-23
8 (CUDA 12.8+ / 13)   bits 8-15                     sm_75 0x06004b04, sm_80
                                                    0x06005004, sm_90 0x06005a04,
                                                    sm_100 0x06006402, sm_120
                                                    0x06007802, sm_121 0x06007902
====================  ============================  =============================

The ABI-8 rows were measured here by compiling one kernel with NVRTC 13.5 for sm_75 ... sm_121
(``e_ident[EI_OSABI] == 0x41``, ``EI_ABIVERSION == 8`` for all). The arch-specific suffixes
(``sm_90a``, ``sm_100a``, ``sm_100f``) gave the same ``e_flags`` as the plain arch, so the
suffix cannot be read back from the header; :func:`cubin_arch` returns the plain ``sm_NN``.

AMD code objects (``e_machine == 224``, EM_AMDGPU). The authoritative target is the
``amdhsa.target`` string in the ``NT_AMDGPU_METADATA`` note (type 32, owner ``AMDGPU``, a
MessagePack map), e.g. ``amdgcn-amd-amdhsa--gfx90a:xnack-``. When the note is absent, the
processor comes from ``e_flags`` bits 0-7 (``EF_AMDGPU_MACH``; table below, measured with
clang 19 for every gfx it supports) and xnack/sramecc from bits 8-9 / 10-11 (code object
v4+: 0 unsupported, 1 any, 2 off, 3 on). The rest of a code object (its symbols and every
kernel's metadata) is read by :mod:`amdgpu_code_object`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kdbkit.kdb.arch import EM_AMDGPU, EM_CUDA, spelling_of
from kdbkit.kdb.errors import BundleNameError
from kdbkit.runtime.backends.base import BinaryLoadError

_ELF_MAGIC = b"\x7fELF"
_SHT_NOTE = 7
_NT_AMDGPU_METADATA = 32

# EF_AMDGPU_MACH -> processor, measured from clang-19 code objects (see module docstring).
AMDGPU_MACH = {
    0x20: "gfx600", 0x21: "gfx601", 0x22: "gfx700", 0x23: "gfx701", 0x24: "gfx702",
    0x25: "gfx703", 0x26: "gfx704", 0x28: "gfx801", 0x29: "gfx802", 0x2A: "gfx803",
    0x2B: "gfx810", 0x2C: "gfx900", 0x2D: "gfx902", 0x2E: "gfx904", 0x2F: "gfx906",
    0x30: "gfx908", 0x31: "gfx909", 0x32: "gfx90c", 0x33: "gfx1010", 0x34: "gfx1011",
    0x35: "gfx1012", 0x36: "gfx1030", 0x37: "gfx1031", 0x38: "gfx1032", 0x39: "gfx1033",
    0x3A: "gfx602", 0x3B: "gfx705", 0x3C: "gfx805", 0x3D: "gfx1035", 0x3E: "gfx1034",
    0x3F: "gfx90a", 0x40: "gfx940", 0x41: "gfx1100", 0x42: "gfx1013", 0x43: "gfx1150",
    0x44: "gfx1103", 0x45: "gfx1036", 0x46: "gfx1101", 0x47: "gfx1102", 0x48: "gfx1200",
    0x4A: "gfx1151", 0x4B: "gfx941", 0x4C: "gfx942", 0x4E: "gfx1201", 0x55: "gfx1152",
}
_FEATURE_STATE = {2: "-", 3: "+"}  # 0 unsupported and 1 any carry no feature
_REBUILD = "it is not a binary for this device: rebuild it from source"


class TargetStringError(BundleNameError):
    """An AMD target string (``gfx90a:xnack-``) is malformed."""


@dataclass(frozen=True)
class ElfHeader:
    """The fields of an ELF header that identify a GPU binary's target."""

    elf_class: int  # 1: 32-bit, 2: 64-bit
    osabi: int
    abi_version: int
    e_type: int
    e_machine: int
    e_flags: int


def read_elf_header(data: bytes, *, what: str = "binary") -> ElfHeader:
    """Parse the ELF header of ``data``.

    Args:
        data: the whole binary.
        what: how to name it in errors (e.g. ``"cubin for relu_fwd"``).

    Returns:
        The header fields.

    Raises:
        BinaryLoadError: ``data`` is not a little-endian ELF file.
    """
    if len(data) < 64 or data[:4] != _ELF_MAGIC:
        raise BinaryLoadError(f"{what} is not an ELF file ({len(data)} bytes, starts {bytes(data[:4])!r})", _REBUILD)
    elf_class, byte_order = data[4], data[5]
    if byte_order != 1:
        raise BinaryLoadError(f"{what} is a big-endian ELF file; GPU binaries are little-endian", _REBUILD)
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    flags_at = 48 if elf_class == 2 else 36  # after e_entry/e_phoff/e_shoff (8 or 4 bytes each)
    (e_flags,) = struct.unpack_from("<I", data, flags_at)
    return ElfHeader(elf_class, data[7], data[8], e_type, e_machine, e_flags)


def cubin_sm(header: ElfHeader) -> int:
    """Return the SM number (``90`` for sm_90) recorded in a cubin's ``e_flags``."""
    if header.abi_version >= 8:
        return (header.e_flags >> 8) & 0xFF
    return header.e_flags & 0xFF


def cubin_arch(data: bytes, *, what: str = "cubin") -> str:
    """Return the arch a CUDA cubin was built for, e.g. ``"sm_90"``.

    Raises:
        BinaryLoadError: not an ELF file, not EM_CUDA (a PTX text or a fatbin, say), or no
            SM number in the header.
    """
    header = read_elf_header(data, what=what)
    if header.e_machine != EM_CUDA:
        raise BinaryLoadError(f"{what} is an ELF file for machine {header.e_machine}, not a CUDA cubin (EM_CUDA=190)",
                              _REBUILD)
    sm = cubin_sm(header)
    if sm < 10:
        raise BinaryLoadError(f"{what} records no SM arch in its ELF flags (e_flags={header.e_flags:#x})", _REBUILD)
    return f"sm_{sm}"


def amdgpu_target(data: bytes, *, what: str = "code object") -> tuple[str, tuple[str, ...]]:
    """Return the processor and target features an AMD code object was built for.

    Returns:
        ``("gfx90a", ("xnack-",))``; features are the ones the binary requires, so an empty
        tuple means "runs with any setting".

    Raises:
        BinaryLoadError: not an ELF file, not EM_AMDGPU, or the target cannot be read.
    """
    header = read_elf_header(data, what=what)
    if header.e_machine != EM_AMDGPU:
        raise BinaryLoadError(
            f"{what} is an ELF file for machine {header.e_machine}, not an AMD GPU code object (EM_AMDGPU=224)"
        )
    target = _amdhsa_target_from_notes(data, header)
    if target is not None:
        try:
            return parse_amdgcn_target(target.split("--", 1)[-1])
        except TargetStringError as e:
            raise BinaryLoadError(f"{what}: unreadable amdhsa.target note: {e.problem}", _REBUILD) from e
    mach = AMDGPU_MACH.get(header.e_flags & 0xFF)
    if mach is None:
        raise BinaryLoadError(
            f"{what} has no amdhsa.target note and an unknown EF_AMDGPU_MACH {header.e_flags & 0xFF:#x}; "
            "rebuild it with a clang that writes code object v4 or newer"
        )
    features = []
    for name, shift in (("sramecc", 10), ("xnack", 8)):
        state = _FEATURE_STATE.get((header.e_flags >> shift) & 0x3)
        if state:
            features.append(name + state)
    return mach, tuple(sorted(features))


def parse_amdgcn_target(text: str) -> tuple[str, tuple[str, ...]]:
    """Split ``gfx90a:sramecc+:xnack-`` into ``("gfx90a", ("sramecc+", "xnack-"))``.

    Accepts the forms HIP's ``gcnArchName``, ``--offload-arch`` and the code object notes use.

    Raises:
        TargetStringError: the text is not a gfx processor with optional ``:<feature>±`` parts.
    """
    parts = text.strip().split(":")
    arch = parts[0]
    if not spelling_of("hip").regex.fullmatch(arch):
        raise TargetStringError(f"{text!r} is not an AMD GPU target",
                                "write it gfx<id>[:<feature>±...], e.g. gfx90a:xnack-")
    features = []
    for feature in parts[1:]:
        if len(feature) < 2 or feature[-1] not in "+-" or not feature[:-1].isalnum():
            raise TargetStringError(f"{text!r}: target feature {feature!r} is not <name>+ or <name>-",
                                    "write features as xnack- or sramecc+")
        features.append(feature)
    return arch, tuple(sorted(features))


def _amdhsa_target_from_notes(data: bytes, header: ElfHeader) -> str | None:
    """Find ``amdhsa.target`` in the AMDGPU metadata note; ``None`` when there is none."""
    if header.elf_class != 2:
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        for i in range(shnum):
            base = shoff + i * shentsize
            (sh_type,) = struct.unpack_from("<I", data, base + 4)
            if sh_type != _SHT_NOTE:
                continue
            offset, size = struct.unpack_from("<QQ", data, base + 24)
            for owner, note_type, desc in _iter_notes(data[offset : offset + size]):
                if owner == b"AMDGPU" and note_type == _NT_AMDGPU_METADATA:
                    target = _metadata_target(desc)
                    if target:
                        return target
    except struct.error:
        return None  # truncated section table: fall back to e_flags
    return None


def _iter_notes(section: bytes):
    """Yield (owner, type, desc) for each ELF note; fields are 4-byte aligned."""
    pos = 0
    while pos + 12 <= len(section):
        namesz, descsz, note_type = struct.unpack_from("<III", section, pos)
        pos += 12
        owner = section[pos : pos + namesz].rstrip(b"\0")
        pos += (namesz + 3) & ~3
        desc = section[pos : pos + descsz]
        pos += (descsz + 3) & ~3
        yield owner, note_type, desc


def _metadata_target(desc: bytes) -> str | None:
    """``amdhsa.target`` of a metadata note's MessagePack map; ``None`` when it cannot be read.

    msgpack is imported here, not with the module: the CUDA backend imports this module for
    :func:`cubin_arch` and should not pay for an AMD-only decoder on every start.
    """
    import msgpack

    try:
        metadata = msgpack.unpackb(desc)
    except (ValueError, TypeError, msgpack.UnpackException):  # ExtraData, FormatError, ... are ValueErrors
        return None
    target = metadata.get("amdhsa.target") if isinstance(metadata, dict) else None
    return target if isinstance(target, str) else None
