"""A program request and its cache key, built in exactly one place.

A program is one kernel source file compiled with one set of options. A
:class:`ProgramRequest` names it (file and normalised options) and is what every part of
kdbkit passes around: the runtime's lookup chain, the JIT, and the offline builder, which
all call :func:`program_key` to turn it into a row of a bundle (the lookup chain through the
:class:`KeyHasher` that program_key uses, kept per kernel file). That row is
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
_NORMAL_DEFINE = re.compile(r"-D([A-Za-z_][A-Za-z0-9_]*)=.*")  # a define as normalising writes it (fullmatch)
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
    if type(options) is tuple and _already_normal(options):
        return options
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


def _already_normal(options: tuple) -> bool:
    """Whether ``options`` is its own normal form: sorted ``-DNAME=VALUE`` defines with distinct
    names, as kdbkit's solvers write them. Checking costs half of normalising, and every
    lookup of a new program normalises its options once."""
    try:
        defines = [*map(_NORMAL_DEFINE.fullmatch, options)]
    except TypeError:  # not all strings: normalising says which
        return False
    if None in defines:
        return False
    return len(defines) < 2 or (len({m[1] for m in defines}) == len(defines) and list(options) == sorted(options))


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
    return key_hasher(request.kernel_file, target.full_arch, source_digest, compiler).key(request.options)


class KeyHasher:
    """:func:`program_key` for every program of one kernel file, one target arch, one source
    digest and one compiler: the fields they share are encoded once, so keying a program
    hashes only its options (a lookup keys each new program; see :func:`key_hasher`)."""

    __slots__ = ("kernel_name", "_head", "_tail", "_suffix")

    def __init__(self, kernel_file: str, arch: str, source_digest: str, compiler: str):
        if not (kernel_file and source_digest and compiler):
            label = "file" if not kernel_file else "source" if not source_digest else "compiler"
            raise ValueError(f"program key for {kernel_file or '?'}: {label} is empty; it must be observed")
        self.kernel_name = f"{kernel_file}.o"
        # label, value, label, value...; the options' value goes between the two halves
        self._head = b"".join((_SCHEMA_FILE, _prefixed(kernel_file), _OPTIONS))
        self._tail = b"".join((_ARCH, _prefixed(arch), _SOURCE, _prefixed(source_digest), _COMPILER, _prefixed(compiler)))
        self._suffix = f"-mcpu={arch} --kdb-key="  # the readable part ends with it, before the digest

    def key(self, options: tuple[str, ...]) -> ProgramKey:
        """The key of this file's program compiled with ``options`` (normalised)."""
        data = "\0".join(options).encode()
        # One hash call over the joined fields (the same bytes as feeding them one by one, at a
        # fraction of the Python overhead: this runs on every lookup).
        digest = hashlib.sha256(b"".join((self._head, len(data).to_bytes(8, "little"), data, self._tail))).hexdigest()
        readable = f"{' '.join(options)} {self._suffix}" if options else self._suffix
        return ProgramKey(self.kernel_name, readable + digest[:32], digest)


class ParsedKey(NamedTuple):
    """What a bundle row's readable key says: the inputs :func:`program_key` takes from the
    request and the target (the source digest and the compiler are hashed, not readable)."""

    kernel_file: str
    options: tuple[str, ...]
    arch: str  # with target features, as keyed: ``gfx90a:xnack-``


# The readable part's tail, as KeyHasher.key writes it: " -mcpu=<arch> --kdb-key=<32 hex digits>"
# (no leading space when there are no options).
_KEY_TAIL = re.compile(r"(?:^| )-mcpu=(\S+) --kdb-key=[0-9a-f]{32}\Z")


def parse_key(kernel_name: str, kernel_args: str) -> ParsedKey | None:
    """The kernel file, options and arch a row's ``kernel_name`` and ``kernel_args`` name, or
    None when they are not laid out as :class:`KeyHasher` writes them (a MIOpen row, a damaged
    one). The inverse of the readable part of a key, so that a key can be computed again from
    a row (``kdb cache export`` checks each entry against the kernel sources this way); an
    option holding a space cannot be told apart from two options, and then the key computed
    again does not match, so such a row is never taken for another."""
    if not (isinstance(kernel_name, str) and isinstance(kernel_args, str)) or not kernel_name.endswith(".o"):
        return None
    m = _KEY_TAIL.search(kernel_args)
    if m is None or len(kernel_name) <= 2:
        return None
    head = kernel_args[:m.start()]
    return ParsedKey(kernel_name[:-2], tuple(head.split(" ")) if head else (), m.group(1))


@functools.lru_cache(maxsize=1024)
def key_hasher(kernel_file: str, arch: str, source_digest: str, compiler: str) -> KeyHasher:
    """The :class:`KeyHasher` of one file, arch (with features), source digest and compiler.

    Raises:
        ValueError: ``kernel_file``, ``source_digest`` or ``compiler`` is empty.
    """
    return KeyHasher(kernel_file, arch, source_digest, compiler)


def _prefixed(text: str) -> bytes:
    """The text's UTF-8 bytes after their length (8 bytes, little-endian)."""
    data = text.encode()
    return len(data).to_bytes(8, "little") + data


# The labels (and the schema's value) of the hashed fields, encoded once.
_SCHEMA_FILE = b"".join(map(_prefixed, ("schema", str(KEY_SCHEMA), "file")))
_OPTIONS, _ARCH, _SOURCE, _COMPILER = map(_prefixed, ("options", "arch", "source", "compiler"))
