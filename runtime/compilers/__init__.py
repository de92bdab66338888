"""Compilers, apart from the device backends: ``compile(request, target, source) -> binary``.

Public API::

    compiler_for(target) -> Compiler     the compiler kdbkit uses for a target here
    compilers_for(backend) -> list       every compiler of a backend, preferred first
    LazyCompiler(target)                 compiler_for, on first use, with the reason if none
    NvrtcCompiler, AmdgcnClangCompiler, HiprtcCompiler, OpenCLCompiler

None of them needs a device or a backend: NVRTC builds any sm_NN and clang any gfx target on
a machine without a GPU; hiprtc needs ROCm's library only; the OpenCL compiler builds for a
local OpenCL device (PoCL on the CPU). The JIT source of the lookup chain and the offline
builder call the same compilers, with the same keys. Importing this package loads no vendor
library.
"""

from __future__ import annotations

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.compilers.amdgcn_clang import AmdgcnClangCompiler
from kdbkit.runtime.compilers.base import Compiler
from kdbkit.runtime.compilers.hiprtc import HiprtcCompiler
from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler
from kdbkit.runtime.compilers.opencl import OpenCLCompiler
from kdbkit.runtime.errors import CompilerUnavailableError

__all__ = ["Compiler", "NvrtcCompiler", "AmdgcnClangCompiler", "HiprtcCompiler", "OpenCLCompiler",
           "LazyCompiler", "compiler_for", "compilers_for"]


def compilers_for(backend: str) -> list[Compiler]:
    """The compilers of ``backend``, preferred first, whether or not they are installed (its
    spec's list: HIP prefers hiprtc, ROCm's, matching the runtime, and falls back to a stock clang).
    Empty for a backend whose compilers are per device (OpenCL): see :func:`compiler_for`."""
    spec = spec_for(backend)
    return [] if spec.machine_local else [cls() for cls in spec.compiler_classes()]


def compiler_for(target: Target) -> Compiler:
    """The compiler kdbkit uses for ``target`` on this machine: the first installed one.

    Raises:
        CompilerUnavailableError: none is installed; the message names each one tried and why.
    """
    spec = spec_for(target.backend)
    if spec.machine_local:  # compiled by the local device the target names
        return spec.compiler_classes()[0](target.arch)
    reasons = []
    for compiler in compilers_for(target.backend):
        why = compiler.unsupported(target)
        if why is None:
            try:
                compiler.identity()
                return compiler
            except CompilerUnavailableError as exc:
                why = exc.problem
        reasons.append(f"{compiler.name}: {why}")
    raise CompilerUnavailableError(f"no compiler for {target} ({'; '.join(reasons) or 'none known'})",
                                   spec.compiler_remedy)


class LazyCompiler:
    """The compiler for one target, found on first use; a missing one is remembered with its reason.

    A handle's user cache and JIT need the local compiler (its identity keys their entries);
    a hit in a system bundle does not, so the lookup waits until then.

    Args:
        target: the device's target.
        compiler: a compiler to use instead of :func:`compiler_for`'s choice.
    """

    def __init__(self, target: Target, compiler: Compiler | None = None):
        self.target = target
        self._compiler = compiler
        self._identity: str | None = None
        self._error: CompilerUnavailableError | None = None

    def get(self) -> Compiler:
        """The compiler; raises CompilerUnavailableError (the same one each time) when there is none."""
        self.identity()
        if self._error is not None:
            raise self._error
        return self._compiler

    def identity(self) -> str | None:
        """The compiler's identity, or None when there is none (see :attr:`error`)."""
        if self._identity is None and self._error is None:
            try:
                if self._compiler is None:
                    self._compiler = compiler_for(self.target)
                self._identity = self._compiler.identity()
            except CompilerUnavailableError as exc:
                self._error = exc
        return self._identity

    @property
    def error(self) -> str | None:
        """Why there is no compiler, once :meth:`identity` found none."""
        return None if self._error is None else str(self._error)
