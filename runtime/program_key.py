"""A program request and its cache key, built in exactly one function.

A program is one kernel source file compiled with one set of options. A
:class:`ProgramRequest` names it (file and normalised options) and is what every part of
kdbkit passes around: the runtime's lookup chain, the JIT, and the offline builder, which
all call :func:`program_key` to turn it into a row of a bundle. That row is
``kernel_name = "<file>.o"`` (MIOpen's convention) and ``kernel_args = "<normalised options>
-mcpu=<arch> --kdb-key=<digest>"``: the readable part lets ``kdb db ls`` show what an entry is;
the digest makes the key change whenever the binary could.

Key layout (version :data:`KEY_SCHEMA`): SHA-256 over length-prefixed, labelled fields, so no
two different inputs produce the same byte string. Version 2 keys the compiler identity as a
whole (version and system header folders, see ``kdbkit.runtime.compilers``) and the source
digest of a search-path lookup with inlined includes (``kdbkit.runtime.kernel_sources``);
bundles keyed by version 1 no longer match.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
from typing import NamedTuple, Sequence

from kdbkit.kdb.target import Target
from kdbkit.runtime.errors import OptionsError

KEY_SCHEMA = 2

_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")
_REMEDY = "write each define as -DNAME or -DNAME=VALUE, once"
_SHLEX_SPECIAL = re.compile(r"""["'\\\x0b\x0c\x1c-\x1f]""")  # what shlex treats apart, or str.split() splits on too


def normalise_options(options: str | Sequence[str]) -> tuple[str, ...]:
    """Order-independent, duplicate-free compile options (remembered per distinct input).

    ``-D NAME=V`` and ``-DNAME=V`` are the same; a bare ``-DNAME`` means ``-DNAME=1`` (as
    compilers define it); options are sorted so that their order does not change the key.

    Raises:
        OptionsError: a ``-D`` without a valid macro name (``-D =3``, ``-D ''``), or a name
            defined twice with different values (order would decide; the caller must say).
    """
    return _normalise(options if isinstance(options, (str, tuple)) else tuple(options))


@functools.lru_cache(maxsize=4096)
def _normalise(options: str | tuple[str, ...]) -> tuple[str, ...]:
    try:
        if isinstance(options, str):
            # shlex's split costs more than the rest of a lookup; where it would split exactly
            # as str.split() (no quotes, escapes or other separators), skip it
            tokens = options.split() if options.isascii() and not _SHLEX_SPECIAL.search(options) else shlex.split(options)
        else:
            tokens = list(options)
    except ValueError as exc:  # an unbalanced quote
        raise OptionsError(f"options {options!r} do not parse: {exc}", "balance the quotes") from exc
    defines: dict[str, str] = {}
    others: set[str] = set()
    it = iter(tokens)
    for tok in it:  # one pass (each lookup of a new program runs it; list comprehensions, not generators, below)
        if tok == "-D":
            tok = next(it, None)
            if tok is None:
                raise OptionsError("-D at the end of the options names no macro", _REMEDY)
            tok = "-D" + tok if isinstance(tok, str) else tok
        if not isinstance(tok, str):
            raise OptionsError(f"option {tok!r} is a {type(tok).__name__}, not a string", _REMEDY)
        m = _DEFINE.match(tok)
        if m:
            name, value = m.group(1), "1" if m.group(2) is None else m.group(2)
            if defines.get(name, value) != value:
                raise OptionsError(f"macro {name} is defined twice ({defines[name]!r} and {value!r})", "keep one")
            defines[name] = value
        elif tok.startswith("-D"):
            raise OptionsError(f"malformed define {tok!r}: no valid macro name", _REMEDY)
        elif tok.strip():
            others.add(tok)
    return tuple(sorted([f"-D{k}={v}" for k, v in defines.items()])) + tuple(sorted(others))


class _RequestFields(NamedTuple):
    kernel_file: str
    options: tuple[str, ...] = ()


class ProgramRequest(_RequestFields):
    """A kernel source file and the options to compile it with, normalised on creation.

    A named tuple, so that hashing and comparing it (several dict lookups per program
    lookup) run in C rather than in a dataclass's generated Python.

    Attributes:
        kernel_file: a name on the kernel search path, e.g. ``activation.c``.
        options: compile options; any order and spelling goes in, the normal form is kept.

    Raises:
        OptionsError: as :func:`normalise_options`.
    """

    __slots__ = ()

    def __new__(cls, kernel_file: str, options: str | Sequence[str] = ()) -> "ProgramRequest":
        return tuple.__new__(cls, (kernel_file, normalise_options(options)))

    def __str__(self) -> str:
        return f"{self.kernel_file} [{' '.join(self.options)}]"


class ProgramKey(NamedTuple):
    """Where a program lives in a bundle, plus the digest that names it."""

    kernel_name: str
    kernel_args: str
    digest: str

    def __str__(self) -> str:
        return f"{self.kernel_name} [{self.kernel_args}]"


def program_key(request: ProgramRequest, *, target: Target, compiler: str, source_digest: str) -> ProgramKey:
    """Key ``request`` for one target and one compiler. Every input of a compile is here.

    Args:
        request: the kernel file (its name on the search path) and its normalised options.
        target: what the binary runs on; its full arch with target features
            (``gfx90a:xnack-``, ``sm_90``) is keyed, not its CU count, because only options
            that mention the CU count change the binary.
        compiler: the identity of the compiler that made (or will make) the binary, as
            ``Compiler.identity()`` gives it: name, version and the identity of every system
            header folder it is handed (e.g. the CUDA headers NVRTC gets with ``-I``); it
            must be observed, never guessed.
        source_digest: the digest of the source with every file it includes, by content
            and relative name (``KernelSearchPath.digest``): the kernel folders handed to the
            compiler are covered by it, whatever machine they sit on.
        (Also mixed in: :data:`KEY_SCHEMA`, this function's layout version.)

    Raises:
        ValueError: an input is empty (an unobservable input is refused, not guessed).
    """
    arch = target.full_arch
    head, tail = _fixed_fields(request.kernel_file, arch, source_digest, compiler)
    options = "\0".join(request.options).encode()
    # One hash call over the joined fields (the same bytes as feeding them one by one, at a
    # fraction of the Python overhead: this runs on every lookup).
    digest = hashlib.sha256(b"".join((head, len(options).to_bytes(8, "little"), options, tail))).hexdigest()
    readable = " ".join((*request.options, f"-mcpu={arch}"))
    return ProgramKey(f"{request.kernel_file}.o", f"{readable} --kdb-key={digest[:32]}", digest)


def _length_prefixed(*texts: str) -> bytes:
    """Each text's UTF-8 bytes after their length (8 bytes, little-endian), one after another."""
    return b"".join([len(data).to_bytes(8, "little") + data for data in map(str.encode, texts)])


@functools.lru_cache(maxsize=1024)
def _fixed_fields(kernel_file: str, arch: str, source_digest: str, compiler: str) -> tuple[bytes, bytes]:
    """The hashed bytes of every field but the options, before and after them: the same for all
    of one kernel file's programs, so a lookup encodes only its options."""
    for label, value in (("file", kernel_file), ("source", source_digest), ("compiler", compiler)):
        if not value:
            raise ValueError(f"program key for {kernel_file or '?'}: {label} is empty; it must be observed")
    # label, value, label, value...; the options' value goes between the two halves
    return (_length_prefixed("schema", str(KEY_SCHEMA), "file", kernel_file, "options"),
            _length_prefixed("arch", arch, "source", source_digest, "compiler", compiler))
