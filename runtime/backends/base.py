"""The one small interface every backend (CUDA, HIP, OpenCL) implements.

A backend drives one device: it loads binaries, launches kernels, moves memory and times
work. It does not compile: compilers live in ``kdbkit.runtime.compilers`` and need no device.
The lookup chain hands every binary, whichever source it came from, to ``load``.

Contracts:
- ``load`` never executes a binary built for another device: backends check what they can
  (ELF machine/arch notes, OpenCL envelope) and raise ``BinaryLoadError``.
- ``close`` releases the device context and everything the backend holds; it is idempotent,
  and buffers and modules of a closed backend must not be used again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from kdbkit.kdb.target import Target
from kdbkit.runtime.errors import (  # noqa: F401 - re-exported: backends raise them
    BackendUnavailableError,
    BinaryLoadError,
    CompileError,
    CompilerUnavailableError,
    LaunchArgumentError,
)


@dataclass(frozen=True)
class MemorySystem:
    """What the launches of memory-bound kernels are sized from (their grids and how many groups
    share a compute unit, ``kdbkit.runtime.primitives.streaming``); each 0 where the backend
    cannot tell, and then those launches keep the shape that suits any device.

    Attributes:
        bandwidth_gbs: peak device-memory bandwidth in GB/s (10^9 bytes), from the memory clock
            and bus width (two transfers a clock).
        l2_bytes: the last-level cache shared by every compute unit.
        threads_per_unit: the most threads a compute unit holds at once.
    """

    bandwidth_gbs: float = 0.0
    l2_bytes: int = 0
    threads_per_unit: int = 0

    @staticmethod
    def from_clock(memory_clock_khz: int, bus_width_bits: int, l2_bytes: int = 0,
                   threads_per_unit: int = 0) -> "MemorySystem":
        """From what the drivers report: the memory clock in kHz and the bus width in bits (HBM
        and GDDR move data on both edges of that clock: two transfers a clock)."""
        bandwidth = 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9 if memory_clock_khz > 0 else 0.0
        return MemorySystem(max(bandwidth, 0.0), max(l2_bytes, 0), max(threads_per_unit, 0))


UNKNOWN_MEMORY = MemorySystem()


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
        runtime: the runtime version the driver supports (``CUDA 13.0``), which decides which
            compilers' binaries it loads (:mod:`kdbkit.runtime.preflight`); "" when unknown.
        memory: the memory system (bandwidth, L2, threads per unit) as far as the driver tells;
            not part of the target: cards of one target (an H100 and an H200 are both
            ``sm_90_132``) share binaries but not bandwidth, so only launches follow it.
    """

    backend: str
    index: int
    name: str
    target: Target
    memory_bytes: int
    driver: str = ""
    runtime: str = ""
    memory: MemorySystem = UNKNOWN_MEMORY


# Buffer and Kernel are plain base classes, not ABCs: isinstance against an ABC's subclass
# goes through ABCMeta.__instancecheck__, several times slower, and launches check every
# argument (about 2,800 such checks in ResNet-50's first forward).
class Buffer:
    """Device memory of a fixed size in bytes."""

    nbytes: int

    def free(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not say how to free itself")


class Kernel:
    """A function in a loaded module, ready to launch."""

    name: str


class Module(ABC):
    """A loaded binary."""

    @abstractmethod
    def function(self, name: str) -> Kernel:
        """Return the kernel ``name``; raises ``BinaryLoadError`` if the binary lacks it."""


class Backend(ABC):
    """One device of one vendor API: load, launch, memory, timing. A context manager."""

    name: str  # "cuda" | "hip" | "opencl"
    binary_format: str  # "cubin", "hsaco", "ocl-binary": recorded in bundles, checked on load
    # Optional abilities, declared (names from kdbkit.runtime.backends.spec.CAPABILITIES, as the
    # backend's spec lists them), never found by hasattr: "streams", "occupancy", "wrap",
    # "param_blocks", "tensor_maps".
    capabilities: frozenset[str] = frozenset()
    device: DeviceInfo
    closed: bool = False  # set by close(): callers check it to refuse work (HandleClosedError)

    @abstractmethod
    def load(self, binary: bytes) -> Module:
        """Load a binary compiled for this device's target (here, or offline by the builder)."""

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

    def launcher(self, kernel: Kernel, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: Sequence[Any], shared_bytes: int = 0) -> Callable[..., None]:
        """A launch made once and run many times: ``args`` as :meth:`launch` takes them, with
        ``None`` where a buffer comes at run time; the result takes those buffers, in order.
        Backends where it pays (CUDA) prepare the fixed arguments' bytes once. The result's
        ``rebound(*blocks)`` is the same launch with its :class:`ParamBlock` arguments replaced,
        in order (a TMA kernel's launch for other tensors), made without preparing the rest again
        where the backend prepares them."""
        slots = [i for i, a in enumerate(args) if a is None]
        template = list(args)

        def run(*buffers: Buffer) -> None:
            filled = list(template)
            for i, buffer in zip(slots, buffers):
                filled[i] = buffer
            self.launch(kernel, grid, block, filled, shared_bytes)

        def rebound(*blocks: Any):
            from kdbkit.runtime.backends.args import ParamBlock

            places = [i for i, a in enumerate(template) if isinstance(a, ParamBlock)]
            if len(blocks) != len(places):
                raise LaunchArgumentError(f"{kernel.name}: a rebound launch takes {len(places)} parameter blocks, "
                                          f"not {len(blocks)}")
            given = list(template)
            for b, i in zip(blocks, places):
                given[i] = b
            return self.launcher(kernel, grid, block, given, shared_bytes)

        run.rebound = rebound  # type: ignore[attr-defined]
        return run

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

    @abstractmethod
    def close(self) -> None:
        """Release the device context and what this backend holds (idempotent)."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
