"""Build small AMD code objects by hand, for the shapes clang never writes (broken, odd, or unsafe).

A real code object comes from clang (see ``test_amdgpu_code_object.py``); this one has only
what the reader looks at: an ELF64 header, a note section with the ``NT_AMDGPU_METADATA``
note, ``.dynsym`` and its ``.dynstr``. Each part can be set to something malformed.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

import msgpack

STT_OBJECT, STT_FUNC = 1, 2
_TEXT, _RODATA = 7, 6  # section indices of a clang code object's .text and .rodata (any non-zero will do)


def kernel_entry(name: str = "k", *, args: Sequence[tuple[int, int, str]] = ((0, 8, "global_buffer"),),
                 **fields: Any) -> dict[str, Any]:
    """One ``amdhsa.kernels`` map, as clang writes it for gfx942, with ``fields`` overriding keys (no dot)."""
    entry = {
        ".name": name, ".symbol": f"{name}.kd",
        ".args": [{".offset": o, ".size": s, ".value_kind": k} for o, s, k in args],
        ".kernarg_segment_size": 280, ".kernarg_segment_align": 8, ".group_segment_fixed_size": 0,
        ".private_segment_fixed_size": 0, ".wavefront_size": 64, ".sgpr_count": 16, ".vgpr_count": 4,
        ".max_flat_workgroup_size": 1024,
    }  # fmt: skip
    entry.update({"." + key: value for key, value in fields.items()})
    return entry


def metadata(*kernels: dict[str, Any], target: str = "amdgcn-amd-amdhsa--gfx942",
             version: Sequence[int] = (1, 2)) -> dict[str, Any]:
    return {"amdhsa.kernels": list(kernels) or [kernel_entry()], "amdhsa.target": target,
            "amdhsa.version": list(version)}


def kernel_symbols(*names: str) -> list[tuple[str, int, int]]:
    """The entry and ``.kd`` symbols clang defines for each kernel."""
    return [s for n in names for s in ((n, STT_FUNC, _TEXT), (f"{n}.kd", STT_OBJECT, _RODATA))]


def make_code_object(meta: dict[str, Any] | bytes | None = None, symbols: Sequence[tuple[str, int, int]] | None = None,
                     *, machine: int = 224, osabi: int = 64, abi_version: int = 3, note_owner: bytes = b"AMDGPU",
                     note_type: int = 32) -> bytes:
    """An ELF64 code object with one metadata note (``meta``: a map to pack, or raw bytes) and ``symbols``.

    ``symbols`` are (name, STT type, section index); index 0 makes an undefined symbol. By
    default: the kernels of ``meta`` and their descriptors.
    """
    meta = metadata() if meta is None else meta
    if symbols is None:
        symbols = kernel_symbols(*(k[".name"] for k in meta["amdhsa.kernels"]))
    desc = meta if isinstance(meta, bytes) else msgpack.packb(meta)
    owner = note_owner + b"\0"
    note = struct.pack("<III", len(owner), len(desc), note_type) + _pad(owner, 4) + _pad(desc, 4)
    strings, entries = b"\0", [bytes(24)]  # the null symbol
    for name, sym_type, section in symbols:
        entries.append(struct.pack("<IBBHQQ", len(strings), (1 << 4) | sym_type, 0, section, 0, 0))
        strings += name.encode() + b"\0"
    dynsym = b"".join(entries)
    body = bytearray(64)
    note_at = len(body)
    body += _pad(note, 8)
    dynsym_at = len(body)
    body += dynsym
    dynstr_at = len(body)
    body += _pad(strings, 8)
    shoff = len(body)
    sections = [
        (0, 0, 0, 0, 0, 0),
        (7, note_at, len(note), 0, 4, 0),  # .note
        (11, dynsym_at, len(dynsym), 3, 8, 24),  # .dynsym, strings in section 3
        (3, dynstr_at, len(strings), 0, 1, 0),  # .dynstr
    ]
    for sh_type, offset, size, link, align, entsize in sections:
        body += struct.pack("<IIQQQQIIQQ", 0, sh_type, 0, 0, offset, size, link, 0, align, entsize)
    ident = b"\x7fELF" + bytes([2, 1, 1, osabi, abi_version]) + bytes(7)
    body[:64] = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, shoff, 0x54C, 64, 56, 0, 64,
                                    len(sections), 0)
    return bytes(body)


def _pad(blob: bytes, align: int) -> bytes:
    return blob + bytes(-len(blob) % align)
