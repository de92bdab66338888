"""The one small interface every backend (CUDA, HIP, OpenCL) implements.

A backend compiles kernel source to a binary, loads binaries, launches kernels and moves
memory. The runtime's lookup chain only ever sees ``compile`` (JIT) and ``load`` (every
other source), so a binary from a bundle and one from the compiler take the same path.

Contracts:
- ``compile`` is pure: same source, options and compiler give equivalent bytes; it raises
  ``CompileError`` with the compiler log on failure.
- ``load`` never executes a binary built for another device: backends check what they can
  (ELF machine/arch notes, OpenCL binary status) and raise ``BinaryLoadError``.
- ``compiler_identity`` names the compiler and its version; if the version cannot be
  observed it raises ``CompilerUnavailableError`` instead of guessing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.target import Target


class BackendUnavailableError(KdbError):
    """The vendor library for this backend is not installed or finds no device."""


class CompilerUnavailableError(KdbError):
    """The backend's compiler is missing or its version cannot be observed."""


class CompileError(KdbError):
    """The compiler rejected a kernel source; the message carries its log."""


class BinaryLoadError(KdbError):
    """A binary could not be loaded on the device (wrong arch, corrupt, unsupported)."""


@dataclass(frozen=True)
class DeviceInfo:
    """One local device, described as a target plus facts for humans.

    Attributes:
        backend: ``cuda``, ``hip`` or ``opencl``.
        index: ordinal within its backend.
        name: marketing name (``NVIDIA H100 80GB HBM3``, ``pthread-AMD EPYC ...``).
        target: arch, features and CU count of this device.
        memory_bytes: global memory size.
        driver: driver version string.
    """

    backend: str
    index: int
    name: str
    target: Target
    memory_bytes: int
    driver: str = ""


class Buffer(ABC):
    """Device memory of a fixed size in bytes."""

    nbytes: int

    @abstractmethod
    def free(self) -> None: ...


class Kernel(ABC):
    """A function in a loaded module, ready to launch."""

    name: str


class Module(ABC):
    """A loaded binary."""

    @abstractmethod
    def function(self, name: str) -> Kernel:
        """Return the kernel ``name``; raises ``BinaryLoadError`` if the binary lacks it."""


class Backend(ABC):
    """One device of one vendor API: compile, load, launch, memory, timing."""

    name: str  # "cuda" | "hip" | "opencl"
    binary_format: str  # "cubin", "hsaco", "ocl-binary": recorded in bundles, checked on load
    device: DeviceInfo

    @abstractmethod
    def compiler_identity(self) -> str:
        """``"<compiler> <version>"``, e.g. ``"nvrtc 13.0"`` or ``"pocl 3.0 llvm 14.0.6"``."""

    @abstractmethod
    def compile(self, source: str, *, name: str, options: Sequence[str], include_dirs: Sequence[Path]) -> bytes:
        """Compile ``source`` (file ``name``, for the log) for this device's arch to a binary."""

    @abstractmethod
    def load(self, binary: bytes) -> Module:
        """Load a binary produced by ``compile`` (here or offline for the same target)."""

    @abstractmethod
    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_bytes: int = 0,
    ) -> None:
        """Launch ``kernel`` on ``grid`` blocks of ``block`` threads (CUDA convention).

        ``args`` holds ``Buffer`` objects and NumPy scalars (``np.int32(n)``,
        ``np.float32(x)``); plain Python ints/floats are refused to avoid width guesses.
        """

    @abstractmethod
    def alloc(self, nbytes: int) -> Buffer: ...

    @abstractmethod
    def to_device(self, array: np.ndarray) -> Buffer: ...

    @abstractmethod
    def to_host(self, buffer: Buffer, out: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def time_ms(self, fn, repeat: int = 1) -> float:
        """Run ``fn()`` ``repeat`` times between device events; return elapsed ms per run."""
