"""The cache key of a program: built in exactly one function.

A program is one kernel source file compiled with one set of options for one arch. Its
row in a bundle is ``kernel_name = "<file>.o"`` (MIOpen's convention) and
``kernel_args = "<normalised options> -mcpu=<arch> --kdb-key=<digest>"``: the readable part
lets ``kdb db ls`` show what an entry is; the digest makes the key change whenever the
binary could. Key layout (version :data:`KEY_SCHEMA`): SHA-256 over length-prefixed,
labelled fields, so no two different inputs can produce the same byte string.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shlex
from dataclasses import dataclass

KEY_SCHEMA = 1

_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")


class OptionsError(ValueError):
    """Options that cannot be normalised (a name defined twice with different values)."""


def normalise_options(options: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Order-independent, duplicate-free compile options (remembered per distinct input).

    ``-D NAME=V`` and ``-DNAME=V`` are the same; a bare ``-DNAME`` means ``-DNAME=1`` (as
    compilers define it); options are sorted so that their order does not change the key.

    Raises:
        OptionsError: a name is defined twice with different values, or a ``-D`` lacks a
            name; order would decide the result, so the caller must say which it means.
    """
    return _normalise(options if isinstance(options, (str, tuple)) else tuple(options))


@functools.lru_cache(maxsize=4096)
def _normalise(options: str | tuple[str, ...]) -> tuple[str, ...]:
    tokens = shlex.split(options) if isinstance(options, str) else list(options)
    merged: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "-D":
            if i + 1 >= len(tokens):
                raise OptionsError("-D at the end of the options names no macro")
            tok, i = "-D" + tokens[i + 1], i + 1
        merged.append(tok)
        i += 1
    defines: dict[str, str] = {}
    others: set[str] = set()
    for tok in merged:
        m = _DEFINE.match(tok)
        if tok.startswith("-D") and not m:
            raise OptionsError(f"malformed define {tok!r}: expected -DNAME or -DNAME=VALUE")
        if m:
            name, value = m.group(1), "1" if m.group(2) is None else m.group(2)
            if defines.get(name, value) != value:
                raise OptionsError(f"macro {name} is defined twice ({defines[name]!r} and {value!r}); keep one")
            defines[name] = value
        else:
            others.add(tok)
    return tuple(sorted(f"-D{k}={v}" for k, v in defines.items())) + tuple(sorted(others))


@dataclass(frozen=True)
class ProgramKey:
    """Where a program lives in a bundle, plus the digest that names it."""

    kernel_name: str
    kernel_args: str
    digest: str

    def __str__(self) -> str:
        return f"{self.kernel_name} [{self.kernel_args}]"


def program_key(*, kernel_file: str, options: tuple[str, ...], arch: str, source_digest: str,
                compiler: str) -> ProgramKey:
    """Build the key of one program. Every input that can change the binary is here.

    Args:
        kernel_file: the source file's name in ``kernels/`` (``softmax.c``).
        options: already normalised (see :func:`normalise_options`).
        arch: the full arch with target features (``gfx90a:xnack-``, ``sm_90``); the CU
            count is not part of it, because only options that mention it change the binary.
        source_digest: SHA-256 of the source with every file it includes.
        compiler: the identity and version of the compiler that made (or will make) the
            binary, e.g. ``nvrtc 13.0``; must be observed, never guessed.
        (Also mixed in: :data:`KEY_SCHEMA`, this function's layout version.)

    Raises:
        ValueError: an input is empty (an unobservable input is refused, not guessed).
    """
    fields = {"schema": str(KEY_SCHEMA), "file": kernel_file, "options": "\0".join(options), "arch": arch,
              "source": source_digest, "compiler": compiler}
    for label in ("file", "arch", "source", "compiler"):
        if not fields[label]:
            raise ValueError(f"program key for {kernel_file or '?'}: {label} is empty; it must be observed")
    # One hash call over the joined fields (the same bytes as feeding them one by one, at a
    # fraction of the Python overhead: this runs on every lookup).
    parts = [part for label, value in fields.items() for part in (label.encode(), value.encode())]
    digest = hashlib.sha256(b"".join(len(p).to_bytes(8, "little") + p for p in parts)).hexdigest()
    readable = " ".join((*options, f"-mcpu={arch}"))
    return ProgramKey(f"{kernel_file}.o", f"{readable} --kdb-key={digest[:32]}", digest)
