"""The one small interface every compiler (NVRTC, clang for amdgcn, hiprtc, OpenCL) implements.

A compiler turns a kernel source into a binary for a target. It needs no device and no
backend: NVRTC builds cubins for any sm_NN and clang code objects for any gfx on a machine
without a GPU, which is what the offline builder and the JIT source both rely on.

Contracts:
- ``identity()`` names the compiler, its version and every system header folder it hands
  the compiler (their content's identity, not their path), e.g.
  ``nvrtc 13.0 + cuda-runtime headers 13.5.37``. It is recorded in bundles and keyed, so a
  binary is never used with another compiler's key. It raises
  :class:`~kdbkit.runtime.errors.CompilerUnavailableError` when the version cannot be
  observed, instead of guessing.
- ``compile()`` compiles exactly the text of the :class:`KernelSource` it is given (includes
  inlined, no file read again), so the binary matches the digest its key was made from. It
  raises :class:`~kdbkit.runtime.errors.CompileError` with the compiler's log.
- ``determinism`` says whether the same source, options and target give the same bytes, as
  measured (docs/reliability.md, "Bit-identical rebuilds"): ``"deterministic"`` (clang);
  ``"fresh-process"``: only as the one compile of a bare new process whose address space is
  not randomised (NVRTC: ptxas's output depends on where its data lies in memory), which a
  reproducible build arranges with the compiler's :meth:`Compiler.bare_job`
  (:mod:`kdbkit.packager.fresh_compile`); ``"none"`` (PoCL, whose
  binaries hold the path of a temporary file); ``"unmeasured"``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from kdbkit.kdb.target import Target
from kdbkit.runtime.kernel_sources import KernelSource
from kdbkit.runtime.program_key import ProgramRequest


DETERMINISM = ("deterministic", "fresh-process", "none", "unmeasured")


@dataclass(frozen=True)
class BareJob:
    """A compile that a bare process runs (:mod:`kdbkit.packager.fresh_compile`): ``payload``,
    plain values its script (``packager/bare_compile.py``) takes; ``finish(kind, value,
    version)`` turns the script's outcome into the binary, or raises as ``compile`` would."""

    payload: tuple
    finish: Callable[[str, Any, Any], bytes]


class Compiler(ABC):
    """Compiles kernel sources to binaries of one format, for the targets of one backend."""

    name: ClassVar[str]  # "nvrtc", "clang", "hiprtc", "opencl"
    backend: ClassVar[str]  # the backend whose devices load its binaries
    binary_format: ClassVar[str]  # "cubin", "hsaco", "ocl-binary": recorded in bundles
    arch_pattern: ClassVar[re.Pattern | None] = None  # the full arches it builds for (None: any of its backend)
    determinism: ClassVar[str] = "unmeasured"  # one of DETERMINISM (the module's docstring says what each means)

    @abstractmethod
    def identity(self) -> str:
        """Name, version and system header folders' identity; raises CompilerUnavailableError."""

    def supported_archs(self) -> tuple[str, ...] | None:
        """The arches the installed compiler says it builds, in its order; None when it cannot
        say (or is not installed). What ``kdb targets`` lists and an unknown arch's error names."""
        return None

    def unsupported(self, target: Target) -> str | None:
        """Why this compiler cannot build for ``target``, or None when it can."""
        if target.backend != self.backend:
            return f"{self.name} builds for {self.backend} targets, not {target.backend} ({target})"
        if self.arch_pattern is not None and not self.arch_pattern.fullmatch(target.full_arch):
            return f"{self.name} cannot build for {target.full_arch}"
        return None

    @abstractmethod
    def compile(self, request: ProgramRequest, target: Target, source: KernelSource) -> bytes:
        """Compile ``source`` with ``request.options`` for ``target``.

        Raises:
            CompileError: the source does not compile; ``.log`` holds the compiler's log.
            CompilerUnavailableError: the compiler is missing or cannot build for ``target``.
        """

    def bare_job(self, request: ProgramRequest, target: Target, source: KernelSource) -> BareJob | None:
        """The compile as a bare process runs it (a ``"fresh-process"`` compiler's, in a
        reproducible build), or None where this compiler has none.

        Raises:
            CompilerUnavailableError: as :meth:`compile` raises it.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
