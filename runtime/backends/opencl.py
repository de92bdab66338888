"""The OpenCL backend (pyopencl): PoCL on the CPU is the default device of a machine without a GPU.

Device identity: an OpenCL binary (PoCL's especially) is tied to the OpenCL implementation,
its version and the exact device, so the arch of an OpenCL device is a hash of those facts:
``ocl-`` + the first 12 hex digits of SHA-256 over (platform name, platform version, device
name, driver version). A bundle built on one machine then only matches devices that can load it.

Binaries: the driver's program binary travels in a small envelope (layout at
``ENVELOPE_MAGIC``) recording the device arch, length and SHA-256 of the payload, because PoCL
checks little itself: a truncated PoCL binary crashes the process inside
``clCreateProgramWithBinary`` (seen with PoCL 3.1). The OpenCL compiler
(``kdbkit.runtime.compilers.opencl``) wraps what it builds; :meth:`OpenCLBackend.load` checks
the envelope first and hands the driver only an intact binary made for this very device.

Launches use the CUDA convention of the :class:`Backend` interface: ``grid`` blocks of
``block`` threads become global size ``grid * block`` and local size ``block``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from typing import Any, Sequence

import numpy as np

from kdbkit.kdb.target import Target
from kdbkit.runtime import pocl_cache
from kdbkit.runtime.backends.args import check_host_out, check_launch_args
from kdbkit.runtime.backends.base import (
    Backend,
    BackendUnavailableError,
    BinaryLoadError,
    Buffer,
    CompilerUnavailableError,
    DeviceInfo,
    Kernel,
    MemorySystem,
    Module,
)
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.errors import LaunchArgumentError, LaunchError
from kdbkit.runtime.logging_setup import get_logger

log = get_logger(__name__)

_SPEC = spec_for("opencl")
_REMEDY = _SPEC.install_remedy

# Envelope of an OpenCL binary, version 1, 64 bytes then the payload (little-endian):
#   0  8   magic b"KDBOCL\0\1" (the last byte is the envelope version)
#   8  16  arch of the device that built it, ASCII, NUL-padded (ocl-<12 hex> is 16 chars)
#   24 8   payload length in bytes (u64)
#   32 32  SHA-256 of the payload
#   64 ... payload: the driver's program binary (CL_PROGRAM_BINARIES)
ENVELOPE_MAGIC = b"KDBOCL\x00\x01"
_ENVELOPE = struct.Struct("<8s16sQ32s")


def cl_module():
    """Import pyopencl lazily; importing kdbkit must not load an OpenCL ICD. PoCL's kernel cache
    is pointed at kdbkit's cache folder first, since PoCL reads its settings once, as it loads."""
    pocl_cache.configure()
    try:
        import pyopencl
    except Exception as e:
        raise BackendUnavailableError(f"pyopencl is not available ({e})", _REMEDY) from e
    return pyopencl


def opencl_arch(platform_name: str, platform_version: str, device_name: str, driver_version: str) -> str:
    """Return the arch of an OpenCL device: ``ocl-<12 hex digits>``.

    The fields are hashed as length-prefixed UTF-8 strings, stripped of surrounding blanks
    (drivers pad some info strings), so that no two different tuples hash alike.
    """
    h = hashlib.sha256()
    for field in (platform_name, platform_version, device_name, driver_version):
        data = field.strip().encode("utf-8")
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return "ocl-" + h.hexdigest()[:12]


def opencl_compiler_identity(platform_name: str, platform_version: str, driver_version: str) -> str:
    """See :meth:`kdbkit.runtime.compilers.opencl.OpenCLCompiler.identity`; a pure function of the driver's strings.

    Raises:
        CompilerUnavailableError: ``driver_version`` is empty.
    """
    pocl = re.search(r"PoCL (\S+)", platform_version)
    llvm = re.search(r"LLVM (\S+?),?(?:\s|$)", platform_version)
    if pocl:
        return f"pocl {pocl.group(1)}" + (f" llvm {llvm.group(1).rstrip(',')}" if llvm else "")
    if not driver_version.strip():
        raise CompilerUnavailableError(f"OpenCL platform {platform_name!r} reports no driver version",
                                       "update the OpenCL driver")
    return f"{platform_name.strip()} {driver_version.strip()}"


def wrap_binary(arch: str, payload: bytes) -> bytes:
    """Put a driver program binary in the kdbkit envelope (layout at ``ENVELOPE_MAGIC``)."""
    return _ENVELOPE.pack(ENVELOPE_MAGIC, arch.encode("ascii"), len(payload), hashlib.sha256(payload).digest()) + payload


def unwrap_binary(data: bytes, arch: str, device_name: str) -> bytes:
    """Check an enveloped binary against this device and return the driver's payload.

    Raises:
        BinaryLoadError: not an envelope, built for another arch, truncated or corrupt.
    """
    if len(data) < _ENVELOPE.size or data[:8] != ENVELOPE_MAGIC:
        raise BinaryLoadError(
            f"{device_name}: not a kdbkit OpenCL binary ({len(data)} bytes, starts {bytes(data[:8])!r})",
            "it must come from kdbkit's OpenCL compiler")
    _, built_for, length, digest = _ENVELOPE.unpack_from(data)
    built_for = built_for.rstrip(b"\0").decode("ascii", "replace")
    if built_for != arch:
        raise BinaryLoadError(
            f"{device_name} is {arch} but this OpenCL binary was built for {built_for}",
            "OpenCL binaries only load on the device and driver that built them: rebuild it on this machine")
    payload = data[_ENVELOPE.size :]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        raise BinaryLoadError(
            f"{device_name}: OpenCL binary is corrupt or truncated ({len(payload)} of {length} payload bytes, "
            "checksum mismatch)", "rebuild it, or clear the cache that held it (`kdb cache clear`)")
    return payload


@functools.lru_cache(maxsize=1)
def device_table(cl) -> tuple[tuple[object, str], ...]:
    """(device, arch) of every OpenCL device, platform by platform in the ICD loader's order, once per process.

    Discovery, the backend and the OpenCL compiler all need it; asking the ICD loader and
    hashing each device's facts again would be paid by every handle.
    """
    table = []
    for platform in cl.get_platforms():
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue  # a platform with no device raises DEVICE_NOT_FOUND
        table.extend((dev, device_arch(dev)) for dev in devices)
    return tuple(table)


def discover() -> list[DeviceInfo]:
    """List the OpenCL devices; an empty list when pyopencl or every ICD is missing.

    Never raises: a missing or broken OpenCL installation means no OpenCL devices.
    """
    try:
        cl = cl_module()
        table = device_table(cl)
    except Exception as e:  # no pyopencl, no ICD loader, PLATFORM_NOT_FOUND_KHR, ...
        log.debug("no OpenCL devices: %s", e)
        return []
    infos = []
    for index, (dev, arch) in enumerate(table):
        try:
            infos.append(_device_info(index, dev, arch))
        except Exception as e:
            log.warning("skipping OpenCL device %d: %s", index, e)
    return infos


def device_arch(dev) -> str:
    """The ``ocl-<hash>`` arch of a pyopencl device (see :func:`opencl_arch`)."""
    return opencl_arch(dev.platform.name, dev.platform.version, dev.name, dev.driver_version)


def _device_info(index: int, dev, arch: str) -> DeviceInfo:
    platform = dev.platform
    return DeviceInfo(
        backend="opencl",
        index=index,
        name=dev.name.strip(),
        target=Target("opencl", arch, (), int(dev.max_compute_units)),
        memory_bytes=int(dev.global_mem_size),
        driver=f"{platform.name.strip()} {dev.driver_version.strip()}",
        # OpenCL tells no memory bandwidth: the streaming launches keep their device-neutral shape.
        memory=MemorySystem(l2_bytes=int(getattr(dev, "global_mem_cache_size", 0) or 0)),
    )


class OpenCLBuffer(Buffer):
    """A ``cl.Buffer`` of ``nbytes`` bytes."""

    def __init__(self, mem, nbytes: int):
        self.mem = mem
        self.nbytes = nbytes
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self.mem.release()
            self.freed = True


class OpenCLKernel(Kernel):
    def __init__(self, name: str, cl_kernel):
        self.name = name
        self.cl_kernel = cl_kernel


class OpenCLModule(Module):
    """A built ``cl.Program``."""

    def __init__(self, program, cl, device_name: str):
        self._program = program
        self._cl = cl
        self._device_name = device_name

    def function(self, name: str) -> Kernel:
        try:
            return OpenCLKernel(name, self._cl.Kernel(self._program, name))
        except self._cl.Error as e:
            kernels = self._program.get_info(self._cl.program_info.KERNEL_NAMES)
            raise BinaryLoadError(
                f"no kernel {name!r} in this OpenCL program on {self._device_name} (it has: {kernels}): {e}"
            ) from e


class OpenCLBackend(Backend):
    """One OpenCL device: a context and one in-order command queue with profiling enabled."""

    name = _SPEC.name
    binary_format = _SPEC.binary_format
    capabilities = _SPEC.capabilities

    def __init__(self, device: DeviceInfo):
        """Open ``device`` (as returned by :func:`discover`).

        Raises:
            BackendUnavailableError: pyopencl is missing or the device is gone.
        """
        if device.backend != "opencl":
            raise BackendUnavailableError(f"{device.name} is a {device.backend} device, not an OpenCL one")
        cl = cl_module()
        table = device_table(cl)
        if device.index >= len(table) or table[device.index][0].name.strip() != device.name:
            raise BackendUnavailableError(
                f"OpenCL device {device.index} ({device.name}) is no longer present",
                "list the devices again (`kdb devices`)")
        self._cl = cl
        self.device = device
        # The device's own arch, not device.target.arch, which KDB_DEVICE_ARCH may override:
        # binaries are checked against what the hardware and driver really are.
        self._dev, self._arch = table[device.index]
        self._ctx = cl.Context([self._dev])
        self._queue = cl.CommandQueue(self._ctx, self._dev, properties=cl.command_queue_properties.PROFILING_ENABLE)

    def __repr__(self) -> str:
        return f"OpenCLBackend({self.device.name!r}, {self.device.target})"

    def load(self, binary: bytes) -> Module:
        """Create and build a program from a binary made by :meth:`compile` on this device.

        Raises:
            BinaryLoadError: not an envelope from :meth:`compile`, truncated, corrupt, made for
                another device or driver, or refused by the driver.
        """
        cl = self._cl
        payload = unwrap_binary(bytes(binary), self._arch, self.device.name)
        try:
            program = cl.Program(self._ctx, [self._dev], [payload])
            program.build(devices=[self._dev])
        except cl.Error as e:
            raise BinaryLoadError(
                f"{self.device.name} ({self.device.target}) cannot load this OpenCL binary ({len(binary)} bytes): {e}",
                "it is corrupt or was built for another device or driver: rebuild it on this machine") from e
        return OpenCLModule(program, cl, self.device.name)

    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_bytes: int = 0,
    ) -> None:
        """Enqueue ``kernel`` on global size ``grid * block`` and local size ``block``.

        ``shared_bytes > 0`` is passed as a ``__local`` buffer after the other arguments, where
        the OpenCL form of a kernel with dynamic shared memory declares it.
        """
        if not isinstance(kernel, OpenCLKernel):
            raise LaunchArgumentError(f"{kernel!r} was not loaded by the OpenCL backend")
        check_launch_args(kernel.name, args, OpenCLBuffer)
        cl = self._cl
        values = [a.mem if isinstance(a, OpenCLBuffer) else a for a in args]
        if shared_bytes > 0:
            values.append(cl.LocalMemory(shared_bytes))
        global_size = tuple(int(g) * int(b) for g, b in zip(grid, block))
        try:
            kernel.cl_kernel(self._queue, global_size, tuple(int(b) for b in block), *values)
        except cl.Error as e:
            raise LaunchError(
                f"launching {kernel.name} on {self.device.name} (grid {grid}, block {block}) failed: {e}",
                "check the grid and block sizes against the kernel and the device's limits") from e

    def alloc(self, nbytes: int) -> Buffer:
        cl = self._cl
        # OpenCL refuses zero-sized buffers; one byte keeps empty tensors legal.
        mem = cl.Buffer(self._ctx, cl.mem_flags.READ_WRITE, size=max(int(nbytes), 1))
        return OpenCLBuffer(mem, int(nbytes))

    def to_device(self, array: np.ndarray) -> Buffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        if host.nbytes:
            self._cl.enqueue_copy(self._queue, buf.mem, host, is_blocking=True)
        return buf

    def to_host(self, buffer: Buffer, out: np.ndarray) -> np.ndarray:
        if not isinstance(buffer, OpenCLBuffer):
            raise LaunchArgumentError(f"{buffer!r} is not an OpenCL buffer of {self.device.name}")
        check_host_out(out, buffer.nbytes, self.device.name)
        if out.nbytes:
            self._cl.enqueue_copy(self._queue, out, buffer.mem, is_blocking=True)
        return out

    def synchronize(self) -> None:
        self._queue.finish()

    def time_ms(self, fn, repeat: int = 1) -> float:
        """Time ``repeat`` calls of ``fn`` between two profiled markers on the queue."""
        cl = self._cl
        start = cl.enqueue_marker(self._queue)
        for _ in range(repeat):
            fn()
        end = cl.enqueue_marker(self._queue)
        end.wait()
        # A marker ends when everything queued before it has finished, so the span from the
        # first marker's end to the second's is the device time of the calls in between.
        return (end.profile.end - start.profile.end) / 1e6 / max(repeat, 1)

    def close(self) -> None:
        """Finish queued work and drop the queue and context (pyopencl releases them)."""
        self.closed = True
        if self._queue is not None:
            self._queue.finish()
            self._queue = None
            self._ctx = None


def build_hint(log_text: str) -> str:
    """A remedy for build failures whose cause is the OpenCL installation, not the kernel."""
    if "unknown target CPU" in log_text:
        return (
            "\nhint: this PoCL's LLVM does not know this CPU (the PyPI pocl-binary-distribution 3.0 ships "
            "LLVM 14, which predates AMD Zen 5); install a newer PoCL, e.g. Debian's `apt-get install "
            "pocl-opencl-icd`, or set POCL_LLVM_CPU_NAME where the PoCL build supports it"
        )
    return ""
