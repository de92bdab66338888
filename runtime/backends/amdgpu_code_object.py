"""Read an AMD GPU code object completely, without any vendor library: symbols and kernel metadata.

:mod:`elf_notes` reads only what identifies a binary's target; this module reads what the
packager checks before storing a code object and what the HIP backend needs to launch one:

- the ELF64 section table, and from it the symbol tables (``.symtab`` and ``.dynsym``);
- the ``NT_AMDGPU_METADATA`` note (owner ``AMDGPU``, type 32): a MessagePack map holding
  ``amdhsa.version``, ``amdhsa.target`` and ``amdhsa.kernels``, one map per kernel with its
  arguments (offset, size, kind), its LDS size, wavefront size and register counts
  (LLVM's AMDGPUUsage, "Code Object V3 to V6 Metadata").

The code object version is ``e_ident[EI_ABIVERSION]`` (``ELFABIVERSION_AMDGPU_HSA_V3`` = 1
... ``_V6`` = 4); ``amdhsa.version`` is checked against it. It does not name the version by
itself: v6 kept v5's ``[1, 2]`` (LLVM reverted its bump to ``[1, 3]``, llvm-project PR 80995;
clang-19 ``-mcode-object-version=6`` writes ``[1, 2]`` with ``EI_ABIVERSION`` 4, measured).

Everything malformed (not ELF, another machine, truncated tables, no metadata, a map of the
wrong shape) is a :class:`BinaryLoadError` with one line saying what; nothing else escapes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack

from kdbkit.runtime.backends.elf_notes import EM_AMDGPU, TargetStringError, parse_amdgcn_target, read_elf_header
from kdbkit.runtime.errors import BinaryLoadError

_ELFOSABI_AMDGPU_HSA = 64
_SHT_SYMTAB, _SHT_STRTAB, _SHT_NOTE, _SHT_NOBITS, _SHT_DYNSYM = 2, 3, 7, 8, 11
_SHN_UNDEF = 0
_STT_SECTION, _STT_FILE = 3, 4
_NT_AMDGPU_METADATA = 32
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_SYMBOL_TABLES = {_SHT_SYMTAB: ".symtab", _SHT_DYNSYM: ".dynsym"}
# e_ident[EI_ABIVERSION] -> code object version, and the amdhsa.version each may carry.
_ABI_VERSIONS = {1: 3, 2: 4, 3: 5, 4: 6}
_METADATA_VERSIONS = {3: {(1, 0)}, 4: {(1, 1)}, 5: {(1, 2)}, 6: {(1, 2), (1, 3)}}
_TARGET_PREFIX = "amdgcn-amd-amdhsa--"
_REBUILD = "rebuild it from its kernel source with kdbkit's AMD compiler"
_MAX_ALIGN = 8  # hip-python's MAX_ALIGN, see packed_offsets


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument as the metadata lays it out in the kernarg segment.

    ``value_kind`` is ``global_buffer`` (a pointer), ``by_value``, or for the arguments the
    runtime fills in itself ``hidden_block_count_x``, ``hidden_global_offset_x``, ...
    ``name`` and ``address_space`` are optional in the metadata (``None`` when absent).
    """

    offset: int
    size: int
    value_kind: str
    name: str | None = None
    address_space: str | None = None


@dataclass(frozen=True)
class KernelMetadata:
    """One entry of ``amdhsa.kernels``; the integer fields are ``None`` where the map lacks them."""

    name: str
    symbol: str  # the kernel descriptor's symbol, ``<name>.kd``
    args: tuple[KernelArg, ...]  # explicit and hidden, in metadata order
    kernarg_segment_size: int | None = None
    kernarg_segment_align: int | None = None
    group_segment_fixed_size: int | None = None  # static LDS bytes
    private_segment_fixed_size: int | None = None
    wavefront_size: int | None = None
    sgpr_count: int | None = None
    vgpr_count: int | None = None
    max_flat_workgroup_size: int | None = None

    @property
    def explicit_args(self) -> tuple[KernelArg, ...]:
        """The arguments a launch passes: every one whose kind is not ``hidden_*``."""
        return tuple(a for a in self.args if not a.value_kind.startswith("hidden_"))


@dataclass(frozen=True)
class Symbol:
    """One ELF symbol (the null symbol at index 0 is never listed)."""

    name: str
    binding: int  # STB_LOCAL 0, STB_GLOBAL 1, STB_WEAK 2
    type: int  # STT_NOTYPE 0, STT_OBJECT 1, STT_FUNC 2, STT_SECTION 3, STT_FILE 4
    section_index: int  # SHN_UNDEF (0) when undefined
    table: str  # ".symtab" or ".dynsym"

    @property
    def defined(self) -> bool:
        return self.section_index != _SHN_UNDEF


@dataclass(frozen=True)
class CodeObject:
    """What an AMD code object declares: its target, version, kernels and symbols."""

    target: str  # amdhsa.target, e.g. "amdgcn-amd-amdhsa--gfx942"
    arch: str  # "gfx942"
    features: tuple[str, ...]  # ("xnack-",); empty: runs with any setting
    code_object_version: int  # 5 for EI_ABIVERSION 3 / amdhsa.version [1, 2]
    kernels: dict[str, KernelMetadata]  # by kernel name
    defined_symbols: tuple[str, ...]  # sorted names, both tables (section and file symbols left out)
    undefined_symbols: tuple[str, ...]  # sorted names the loader would have to resolve
    symbols: tuple[Symbol, ...] = field(default=(), repr=False)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the whole decoded map


def packed_offsets(sizes: Sequence[int]) -> list[int]:
    """Offsets at which kdbkit's HIP launch packs explicit arguments of these byte sizes.

    The HIP backend hands the arguments to ``hipModuleLaunchKernel(..., extra=values)``;
    hip-python (``hip/_hip_helpers.pyx``, ``HipModuleLaunchKernel_extra.init_from_pyobj``)
    copies them one after another into one buffer, each at
    ``offset = align_up(previous end, min(size, 8))`` (pointers are 8 bytes). That is C
    alignment for scalars and pointers, but not for a 16-byte vector (the ABI aligns it to 16)
    or a struct whose alignment is not min(size, 8): such a kernel reads shifted arguments.

    Raises:
        ValueError: a size below 1 (hip-python would divide by zero).
    """
    offsets, end = [], 0
    for size in sizes:
        if size < 1:
            raise ValueError(f"argument size {size} is not positive")
        align = min(size, _MAX_ALIGN)
        start = -(-end // align) * align
        offsets.append(start)
        end = start + size
    return offsets


def code_object_version(data: bytes, *, what: str = "code object") -> int:
    """The code object version ``data`` declares (5 for ``EI_ABIVERSION`` 3), from its ELF header alone.

    ROCm's loader refuses a version newer than its release knows (:mod:`kdbkit.runtime.preflight`
    says which release loads which); the header alone tells it, so judging a bundle reads no
    section or metadata.

    Raises:
        BinaryLoadError: not a 64-bit little-endian HSA code object for EM_AMDGPU, or an
            ``EI_ABIVERSION`` that no code object version this reader knows has.
    """
    header = read_elf_header(data, what=what)
    if header.e_machine != EM_AMDGPU:
        raise BinaryLoadError(f"{what} is an ELF file for machine {header.e_machine}, "
                              "not an AMD GPU code object (EM_AMDGPU=224)", _REBUILD)
    if header.elf_class != 2 or header.osabi != _ELFOSABI_AMDGPU_HSA:
        raise BinaryLoadError(f"{what} is not a 64-bit HSA code object (ELF class {header.elf_class}, "
                              f"OS/ABI {header.osabi}; expected 2 and {_ELFOSABI_AMDGPU_HSA})", _REBUILD)
    version = _ABI_VERSIONS.get(header.abi_version)
    if version is None:
        raise BinaryLoadError(f"{what} has EI_ABIVERSION {header.abi_version}, not a code object version "
                              "this reader knows (v3 to v6: 1 to 4)", _REBUILD)
    return version


def read_code_object(data: bytes, *, what: str = "code object") -> CodeObject:
    """Read ``data``'s sections, symbols and metadata note.

    Args:
        data: the whole code object.
        what: how to name it in errors (``"code object of activation.c for gfx942"``).

    Raises:
        BinaryLoadError: not a 64-bit little-endian HSA code object for EM_AMDGPU, tables
            or notes that run past the end, no metadata note, or metadata of the wrong shape.
    """
    data = bytes(data)
    version = code_object_version(data, what=what)
    sections = _sections(data, what)
    symbols = _symbols(data, sections, what)
    metadata = _metadata(data, sections, what)
    _check_metadata_version(metadata, version, what)
    target = metadata.get("amdhsa.target")
    if not isinstance(target, str) or not target.startswith(_TARGET_PREFIX):
        raise BinaryLoadError(f"{what}: amdhsa.target is {target!r}, not {_TARGET_PREFIX}<processor>", _REBUILD)
    try:
        arch, features = parse_amdgcn_target(target[len(_TARGET_PREFIX):])
    except TargetStringError as e:
        raise BinaryLoadError(f"{what}: unreadable amdhsa.target: {e.problem}", _REBUILD) from e
    named = [s for s in symbols if s.name and s.type not in (_STT_SECTION, _STT_FILE)]
    return CodeObject(
        target=target, arch=arch, features=features, code_object_version=version,
        kernels=_kernels(metadata, what),
        defined_symbols=tuple(sorted({s.name for s in named if s.defined})),
        undefined_symbols=tuple(sorted({s.name for s in named if not s.defined})),
        symbols=symbols, metadata=metadata,
    )  # fmt: skip


# ---------------------------------------------------------------- ELF tables


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    align: int
    entsize: int


def _sections(data: bytes, what: str) -> list[_Section]:
    """The section table, every section's contents checked to lie inside ``data``."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff == 0:
        raise BinaryLoadError(f"{what} has no section table", _REBUILD)
    if shentsize != _SECTION.size:
        raise BinaryLoadError(f"{what}: section headers are {shentsize} bytes, not {_SECTION.size}", _REBUILD)
    if shnum == 0 and shoff + _SECTION.size <= len(data):
        shnum = _SECTION.unpack_from(data, shoff)[5]  # extended numbering: the count is section 0's sh_size
    if shoff + shnum * _SECTION.size > len(data):
        raise BinaryLoadError(f"{what} is truncated: its {shnum} section headers at offset {shoff} end past "
                              f"its {len(data)} bytes", _REBUILD)
    sections = []
    for i in range(shnum):
        _, sh_type, _, _, offset, size, link, _, align, entsize = _SECTION.unpack_from(data, shoff + i * _SECTION.size)
        if sh_type != _SHT_NOBITS and offset + size > len(data):
            raise BinaryLoadError(f"{what} is truncated: section {i} (type {sh_type}, {size} bytes at {offset}) "
                                  f"ends past its {len(data)} bytes", _REBUILD)
        sections.append(_Section(sh_type, offset, size, link, align, entsize))
    return sections


def _symbols(data: bytes, sections: list[_Section], what: str) -> tuple[Symbol, ...]:
    """Every symbol of ``.symtab`` and ``.dynsym`` but the null one."""
    tables = [s for s in sections if s.type in _SYMBOL_TABLES]
    if not tables:
        raise BinaryLoadError(f"{what} has no symbol table (.symtab or .dynsym)", _REBUILD)
    symbols = []
    for table in tables:
        label = _SYMBOL_TABLES[table.type]
        if table.entsize != _SYMBOL.size or table.size % _SYMBOL.size:
            raise BinaryLoadError(f"{what}: {label} has {table.size} bytes of {table.entsize}-byte entries; "
                                  f"symbols are {_SYMBOL.size} bytes", _REBUILD)
        if table.link >= len(sections) or sections[table.link].type != _SHT_STRTAB:
            raise BinaryLoadError(f"{what}: {label} links to section {table.link}, not a string table", _REBUILD)
        strings = sections[table.link]
        names = data[strings.offset : strings.offset + strings.size]
        for i in range(1, table.size // _SYMBOL.size):
            st_name, st_info, _, st_shndx, _, _ = _SYMBOL.unpack_from(data, table.offset + i * _SYMBOL.size)
            name = _string(names, st_name, f"{what}: {label} symbol {i}")
            symbols.append(Symbol(name, st_info >> 4, st_info & 0xF, st_shndx, label))
    return tuple(symbols)


def _string(table: bytes, offset: int, where: str) -> str:
    end = table.find(b"\0", offset) if offset < len(table) else -1
    if end < 0:
        raise BinaryLoadError(f"{where}: its name at {offset} is outside its string table or unterminated", _REBUILD)
    try:
        return table[offset:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise BinaryLoadError(f"{where}: its name is not UTF-8 ({e.reason})", _REBUILD) from e


def _metadata_note(data: bytes, sections: list[_Section], what: str) -> bytes:
    """The description of the first ``AMDGPU`` / ``NT_AMDGPU_METADATA`` note."""
    for section in (s for s in sections if s.type == _SHT_NOTE):
        align = 8 if section.align == 8 else 4  # note fields are padded to the section's alignment
        pos, end = section.offset, section.offset + section.size
        while pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", data, pos)
            name_at = pos + 12
            desc_at = name_at + -(-namesz // align) * align
            if desc_at + descsz > end:
                raise BinaryLoadError(f"{what} is truncated: a note at offset {pos} ({namesz}-byte owner, "
                                      f"{descsz}-byte description) ends past its section", _REBUILD)
            if data[name_at : name_at + namesz].rstrip(b"\0") == b"AMDGPU" and note_type == _NT_AMDGPU_METADATA:
                return data[desc_at : desc_at + descsz]
            pos = desc_at + -(-descsz // align) * align
    raise BinaryLoadError(f"{what} has no NT_AMDGPU_METADATA note (code object v2, or stripped)", _REBUILD)


# ---------------------------------------------------------------- the metadata map


def _metadata(data: bytes, sections: list[_Section], what: str) -> dict[str, Any]:
    blob = _metadata_note(data, sections, what)
    try:
        metadata = msgpack.unpackb(blob)
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # ExtraData, FormatError, ... are ValueErrors
        raise BinaryLoadError(f"{what}: its metadata note is not MessagePack ({type(e).__name__}: {e})",
                              _REBUILD) from e
    if not isinstance(metadata, dict):
        raise BinaryLoadError(f"{what}: its metadata is a {type(metadata).__name__}, not a map", _REBUILD)
    return metadata


def _check_metadata_version(metadata: dict[str, Any], version: int, what: str) -> None:
    declared = metadata.get("amdhsa.version")
    if not (isinstance(declared, list) and len(declared) == 2 and all(_is_count(v) for v in declared)):
        raise BinaryLoadError(f"{what}: amdhsa.version is {declared!r}, not [major, minor]", _REBUILD)
    if tuple(declared) not in _METADATA_VERSIONS[version]:
        raise BinaryLoadError(f"{what}: amdhsa.version {declared} does not belong to code object v{version} "
                              "(its EI_ABIVERSION)", _REBUILD)


def _kernels(metadata: dict[str, Any], what: str) -> dict[str, KernelMetadata]:
    entries = metadata.get("amdhsa.kernels", [])
    if not isinstance(entries, list):
        raise BinaryLoadError(f"{what}: amdhsa.kernels is a {type(entries).__name__}, not a list", _REBUILD)
    kernels: dict[str, KernelMetadata] = {}
    for i, entry in enumerate(entries):
        kernel = _kernel(entry, f"{what}: amdhsa.kernels[{i}]")
        if kernel.name in kernels:
            raise BinaryLoadError(f"{what}: two kernels are named {kernel.name!r}", _REBUILD)
        kernels[kernel.name] = kernel
    return kernels


def _kernel(entry: Any, where: str) -> KernelMetadata:
    if not isinstance(entry, dict):
        raise BinaryLoadError(f"{where} is a {type(entry).__name__}, not a map", _REBUILD)
    name = _required(entry, ".name", str, where)
    where = f"{where} ({name})"
    args = entry.get(".args", [])  # a kernel without arguments may have no .args
    if not isinstance(args, list):
        raise BinaryLoadError(f"{where}: .args is a {type(args).__name__}, not a list", _REBUILD)
    counts = {key: _optional(entry, "." + key, int, where) for key in (
        "kernarg_segment_size", "kernarg_segment_align", "group_segment_fixed_size", "private_segment_fixed_size",
        "wavefront_size", "sgpr_count", "vgpr_count", "max_flat_workgroup_size")}  # fmt: skip
    return KernelMetadata(name=name, symbol=_required(entry, ".symbol", str, where),
                          args=tuple(_arg(a, f"{where} .args[{j}]") for j, a in enumerate(args)), **counts)


def _arg(entry: Any, where: str) -> KernelArg:
    if not isinstance(entry, dict):
        raise BinaryLoadError(f"{where} is a {type(entry).__name__}, not a map", _REBUILD)
    return KernelArg(
        offset=_required(entry, ".offset", int, where),
        size=_required(entry, ".size", int, where),
        value_kind=_required(entry, ".value_kind", str, where),
        name=_optional(entry, ".name", str, where),
        address_space=_optional(entry, ".address_space", str, where),
    )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _optional(entry: dict, key: str, kind: type, where: str) -> Any:
    value = entry.get(key)
    if value is None:
        return None
    if not (_is_count(value) if kind is int else isinstance(value, kind)):
        expected = "a non-negative integer" if kind is int else "a string"
        raise BinaryLoadError(f"{where}: {key} is {value!r}, not {expected}", _REBUILD)
    return value


def _required(entry: dict, key: str, kind: type, where: str) -> Any:
    value = _optional(entry, key, kind, where)
    if value is None:
        raise BinaryLoadError(f"{where} has no {key}", _REBUILD)
    return value
