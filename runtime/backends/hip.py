"""The HIP backend: the HIP module API to load and run code objects, through ``hip-python``.

(hiprtc, the HIP compiler, lives in ``kdbkit.runtime.compilers.hiprtc``: compiling needs no device.)

``hip-python`` mirrors the C API: ``from hip import hip, hiprtc``; every call returns a tuple
whose first element is the error (``hipError_t`` or ``hiprtcResult``) and whose other elements
are the outputs. Devices are found through HIP (``gcnArchName`` such as
``gfx90a:sramecc+:xnack-``, compute units, memory) with the driver version from ``amdsmi``
when it is installed. ``import amdsmi`` raises ``KeyError`` (not ``ImportError``) on machines
without ROCm, so every vendor import here catches ``Exception``. Nothing is imported before a
function needs it: a missing ROCm means "no HIP devices", never an error.

Binaries are AMD code objects (``hsaco``). Before ``hipModuleLoadData`` the code object's
target is read from its ELF notes (:func:`runtime.backends.elf_notes.amdgpu_target`) and
checked against the device: same processor, and every target feature the binary was built
with (``xnack-``) must match the device's setting.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from kdbkit.kdb.errors import KdbError
from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.args import check_host_out, check_launch_args, scalar_ctype
from kdbkit.runtime.backends.base import (
    Backend,
    BackendUnavailableError,
    BinaryLoadError,
    Buffer,
    DeviceInfo,
    Kernel,
    Module,
)
from kdbkit.runtime.backends.elf_notes import amdgpu_target, parse_amdgcn_target
from kdbkit.runtime.errors import DeviceCallError, LaunchArgumentError, LaunchError
from kdbkit.runtime.logging_setup import get_logger

log = get_logger(__name__)

_REMEDY = "install ROCm and the HIP extra: pip install 'kdbkit[hip]'"


def parse_gcn_arch_name(text: str | bytes) -> tuple[str, tuple[str, ...]]:
    """Split HIP's ``gcnArchName`` into processor and sorted features.

    ``"gfx90a:sramecc+:xnack-"`` -> ``("gfx90a", ("sramecc+", "xnack-"))``;
    ``"gfx1100"`` -> ``("gfx1100", ())``. NUL padding (from a C char array) is dropped.

    Raises:
        TargetStringError: the text is not ``gfx<id>[:<feature>±]...``.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).split(b"\0", 1)[0].decode("ascii", "replace")
    return parse_amdgcn_target(text.split("\0", 1)[0])


def check_code_object(data: bytes, hardware: Target, device_name: str) -> Target:
    """Check, from its ELF notes, that an AMD code object runs on a GPU that is ``hardware``.

    Args:
        data: the binary.
        hardware: the GPU's processor and feature settings (from ``gcnArchName``).
        device_name: for messages.

    Returns:
        The target the code object was built for.

    Raises:
        BinaryLoadError: not an AMD code object, another processor, or a feature setting
            (``xnack+``/``xnack-``, ``sramecc±``) the device does not have.
    """
    arch, features = amdgpu_target(data, what=f"binary for {device_name}")
    built = Target("hip", arch, features)
    reason = hardware.accepts(built)
    if reason is not None:
        raise BinaryLoadError(
            f"{device_name} is {hardware.full_arch} but this code object was built for {built.full_arch} "
            f"({reason})", f"rebuild it for {hardware.full_arch}")
    return built


def _hip():
    """Import hip-python lazily; importing kdbkit must not load the HIP runtime."""
    try:
        from hip import hip
    except Exception as e:  # ImportError, or the binding failing to find libamdhip64
        raise BackendUnavailableError(f"hip-python is not available ({e})", _REMEDY) from e
    return hip


def _code(err) -> int:
    return int(getattr(err, "value", err))


def check_hip_result(result, call: str, error: type[KdbError] = DeviceCallError,
                     remedy: str = "see the HIP documentation of that error"):
    """Unpack a hip-python ``(err, *values)`` tuple (hip and hiprtc alike); raise ``error``
    naming ``call`` on any error.

    ``hipSuccess`` and ``HIPRTC_SUCCESS`` are 0, so the check needs no import; the error is
    read through ``.value`` because the binding's enums are ``enum.Enum`` members.
    """
    if not isinstance(result, tuple):  # some void-returning calls give the bare error
        result = (result,)
    err, *values = result
    if _code(err) != 0:
        raise error(f"{call} failed ({getattr(err, 'name', err)})", remedy)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def discover() -> list[DeviceInfo]:
    """List HIP devices in HIP ordinal order; an empty list without ROCm or hip-python.

    Never raises.
    """
    try:
        hip = _hip()
        count = check_hip_result(hip.hipGetDeviceCount(), "hipGetDeviceCount")
    except Exception as e:
        log.debug("no HIP devices: %s", e)
        return []
    driver = _driver_version(hip)
    devices = []
    for ordinal in range(count or 0):
        try:
            props = hip.hipDeviceProp_t()
            check_hip_result(hip.hipGetDeviceProperties(props, ordinal), "hipGetDeviceProperties")
            arch, features = parse_gcn_arch_name(props.gcnArchName)
            name = props.name
            name = name.split(b"\0", 1)[0].decode() if isinstance(name, (bytes, bytearray)) else str(name)
            devices.append(
                DeviceInfo(
                    backend="hip",
                    index=ordinal,
                    name=name,
                    target=Target("hip", arch, features, int(props.multiProcessorCount)),
                    memory_bytes=int(props.totalGlobalMem),
                    driver=driver,
                )
            )
        except Exception as e:
            log.warning("skipping HIP device %d: %s", ordinal, e)
    return devices


def _driver_version(hip) -> str:
    """The amdgpu driver version from amdsmi, else the HIP driver version, else ``""``."""
    try:
        import amdsmi  # raises KeyError, not ImportError, where ROCm is absent

        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            if handles:
                info = amdsmi.amdsmi_get_gpu_driver_info(handles[0])
                return f"{info.get('driver_name', 'amdgpu')} {info['driver_version']}".strip()
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception as e:
        log.debug("amdsmi unavailable: %s", e)
    try:
        version = check_hip_result(hip.hipDriverGetVersion(), "hipDriverGetVersion")
        return f"HIP {version}"
    except Exception:
        return ""


class HipBuffer(Buffer):
    """``nbytes`` of device memory from ``hipMalloc``."""

    def __init__(self, backend: "HipBackend", ptr, nbytes: int):
        self._backend = backend
        self.ptr = ptr
        self.nbytes = nbytes
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self._backend._activate()
            check_hip_result(self._backend._hip.hipFree(self.ptr), "hipFree")
            self.freed = True


class HipKernel(Kernel):
    def __init__(self, name: str, function, module: "HipModule"):
        self.name = name
        self.function = function
        self._module = module  # keeps the module loaded while the kernel is in use


class HipModule(Module):
    """A code object loaded with ``hipModuleLoadData``."""

    def __init__(self, backend: "HipBackend", handle):
        self._backend = backend
        self.handle = handle

    def function(self, name: str) -> Kernel:
        self._backend._activate()
        try:
            fn = check_hip_result(self._backend._hip.hipModuleGetFunction(self.handle, name.encode()),
                                  "hipModuleGetFunction")
        except DeviceCallError as e:
            raise BinaryLoadError(
                f"no kernel {name!r} in this code object on {self._backend.device.name} ({e.problem})",
                "HIP kernels must be declared with KDB_KERNEL (extern \"C\") to keep their names") from e
        return HipKernel(name, fn, self)


class HipBackend(Backend):
    """One HIP device."""

    name = "hip"
    binary_format = "hsaco"

    def __init__(self, device: DeviceInfo):
        """Open ``device`` (as returned by :func:`discover`).

        Raises:
            BackendUnavailableError: no hip-python/ROCm, or the device cannot be opened.
        """
        if device.backend != "hip":
            raise BackendUnavailableError(f"{device.name} is a {device.backend} device, not a HIP one")
        self._hip = _hip()
        self.device = device
        props = self._hip.hipDeviceProp_t()
        check_hip_result(self._hip.hipGetDeviceProperties(props, device.index), "hipGetDeviceProperties")
        # What the hardware is, whatever KDB_DEVICE_ARCH says: code objects are checked against it.
        arch, features = parse_gcn_arch_name(props.gcnArchName)
        self.hardware_target = Target("hip", arch, features)
        self._activate()

    def __repr__(self) -> str:
        return f"HipBackend({self.device.name!r}, {self.device.target})"

    def _activate(self) -> None:
        check_hip_result(self._hip.hipSetDevice(self.device.index), "hipSetDevice")

    def load(self, binary: bytes) -> Module:
        """Load a code object after checking its target against this GPU.

        Raises:
            BinaryLoadError: not an AMD code object, built for another processor or with a
                feature setting the device lacks, or refused by the runtime.
        """
        data = bytes(binary)
        arch = check_code_object(data, self.hardware_target, self.device.name).arch
        self._activate()
        try:
            module = check_hip_result(self._hip.hipModuleLoadData(data), "hipModuleLoadData")
        except DeviceCallError as e:
            raise BinaryLoadError(f"{self.device.name} refused a {arch} code object: {e.problem}",
                                  "the binary is damaged or needs a newer ROCm: rebuild it") from e
        return HipModule(self, module)

    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_bytes: int = 0,
    ) -> None:
        """``hipModuleLaunchKernel`` with the arguments packed by hip-python from ``extra``.

        hip-python lays out the ``extra`` tuple (ctypes scalars and device pointers) with C
        alignment into the argument buffer the kernel expects.
        """
        if not isinstance(kernel, HipKernel):
            raise LaunchArgumentError(f"{kernel!r} was not loaded by the HIP backend")
        check_launch_args(kernel.name, args, HipBuffer)
        extra = tuple(a.ptr if isinstance(a, HipBuffer) else scalar_ctype(a) for a in args)
        self._activate()
        check_hip_result(
            self._hip.hipModuleLaunchKernel(
                kernel.function,
                *(int(g) for g in grid),
                *(int(b) for b in block),
                sharedMemBytes=int(shared_bytes),
                stream=None,
                kernelParams=None,
                extra=extra,
            ),
            f"hipModuleLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)})",
            LaunchError,
        )

    def alloc(self, nbytes: int) -> Buffer:
        self._activate()
        # hipMalloc(0) returns a null pointer; one byte keeps empty tensors legal.
        ptr = check_hip_result(self._hip.hipMalloc(max(int(nbytes), 1)), "hipMalloc")
        return HipBuffer(self, ptr, int(nbytes))

    def to_device(self, array: np.ndarray) -> Buffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        if host.nbytes:
            kind = self._hip.hipMemcpyKind.hipMemcpyHostToDevice
            check_hip_result(self._hip.hipMemcpy(buf.ptr, host, host.nbytes, kind), "hipMemcpy(HostToDevice)")
        return buf

    def to_host(self, buffer: Buffer, out: np.ndarray) -> np.ndarray:
        if not isinstance(buffer, HipBuffer):
            raise LaunchArgumentError(f"{buffer!r} is not a HIP buffer of {self.device.name}")
        check_host_out(out, buffer.nbytes, self.device.name)
        self._activate()
        if out.nbytes:
            kind = self._hip.hipMemcpyKind.hipMemcpyDeviceToHost
            check_hip_result(self._hip.hipMemcpy(out, buffer.ptr, out.nbytes, kind), "hipMemcpy(DeviceToHost)")
        return out

    def synchronize(self) -> None:
        self._activate()
        check_hip_result(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize")

    def time_ms(self, fn, repeat: int = 1) -> float:
        """Time ``repeat`` calls of ``fn`` between two events on the null stream."""
        hip = self._hip
        self._activate()
        start = check_hip_result(hip.hipEventCreate(), "hipEventCreate")
        end = check_hip_result(hip.hipEventCreate(), "hipEventCreate")
        try:
            check_hip_result(hip.hipEventRecord(start, None), "hipEventRecord")
            for _ in range(repeat):
                fn()
            self._activate()
            check_hip_result(hip.hipEventRecord(end, None), "hipEventRecord")
            check_hip_result(hip.hipEventSynchronize(end), "hipEventSynchronize")
            ms = check_hip_result(hip.hipEventElapsedTime(start, end), "hipEventElapsedTime")
        finally:
            hip.hipEventDestroy(start)
            hip.hipEventDestroy(end)
        return float(ms) / max(repeat, 1)

    def close(self) -> None:
        """Wait for the device's work; HIP keeps one context per device, shared, so nothing is released."""
        if self._hip is not None:
            self._activate()
            check_hip_result(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize")
            self._hip = None
