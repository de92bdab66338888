"""The HIP backend: the HIP module API to load and run code objects, through ``hip-python``.

(hiprtc, the HIP compiler, lives in ``kdbkit.runtime.compilers.hiprtc``: compiling needs no
device. How each hip-python release line is called lives in ``hip_binding``.)

Devices are found through HIP (``gcnArchName`` such as ``gfx90a:sramecc+:xnack-``, compute
units, memory) with the driver version from ``amdsmi`` when it is installed. ``import
amdsmi`` raises ``KeyError`` (not ``ImportError``) on machines without ROCm, so every vendor
import here catches ``Exception``. Nothing is imported before a function needs it: a missing
ROCm means "no HIP devices", never an error.

Binaries are AMD code objects (``hsaco``). Before ``hipModuleLoadData`` the code object's
target is read from its ELF notes (:func:`runtime.backends.elf_notes.amdgpu_target`) and
checked against the device: same processor, and every target feature the binary was built
with (``xnack-``) must match the device's setting.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.amdgpu_code_object import KernelArg, read_code_object
from kdbkit.runtime.backends.args import check_host_out, check_launch_args, scalar_ctype
from kdbkit.runtime.backends.base import (
    Backend,
    BackendUnavailableError,
    BinaryLoadError,
    Buffer,
    DeviceInfo,
    Kernel,
    MemorySystem,
    Module,
)
from kdbkit.runtime.backends.elf_notes import amdgpu_target, parse_amdgcn_target
from kdbkit.runtime.backends.hip_binding import device_properties, hip_call, load_hip
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.errors import DeviceCallError, LaunchArgumentError, LaunchError, TransferError
from kdbkit.runtime.logging_setup import get_logger

log = get_logger(__name__)
_SPEC = spec_for("hip")


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


def discover() -> list[DeviceInfo]:
    """List HIP devices in HIP ordinal order; an empty list without ROCm or hip-python.

    Never raises: a device that cannot be read is skipped with a warning.
    """
    try:
        hip = load_hip()
        count = hip_call(hip.hipGetDeviceCount, call="hipGetDeviceCount")
    except Exception as e:
        log.debug("no HIP devices: %s", e)
        return []
    driver, runtime = _driver_version(hip), _runtime_version(hip)
    devices = []
    for ordinal in range(count or 0):
        try:
            props = device_properties(hip, ordinal)
            arch, features = parse_gcn_arch_name(props.gcnArchName)
            devices.append(
                DeviceInfo(
                    backend="hip",
                    index=ordinal,
                    name=_c_string(props.name),
                    target=Target("hip", arch, features, int(props.multiProcessorCount)),
                    memory_bytes=int(props.totalGlobalMem),
                    driver=driver,
                    runtime=runtime,
                    memory=_memory_system(props),
                )
            )
        except Exception as e:
            log.warning("skipping HIP device %d: %s", ordinal, getattr(e, "problem", e))
    return devices


def _memory_system(props) -> MemorySystem:
    """``hipDeviceProp_t``'s memory clock (kHz), bus width, L2 size and threads per compute
    unit; a field this hip-python release lacks counts as unknown (0)."""
    def field(name: str) -> int:
        try:
            return int(getattr(props, name, 0) or 0)
        except (TypeError, ValueError):
            return 0

    return MemorySystem.from_clock(field("memoryClockRate"), field("memoryBusWidth"), field("l2CacheSize"),
                                   field("maxThreadsPerMultiProcessor"))


def _c_string(value) -> str:
    """A C char array as hip-python returns it (bytes with NUL padding, or str)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).split("\0", 1)[0]


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
        return f"HIP {hip_call(hip.hipDriverGetVersion, call='hipDriverGetVersion')}"
    except Exception:
        return ""


def _runtime_version(hip) -> str:
    """``HIP <major>.<minor>`` of the HIP runtime, the ROCm release it ships in (preflight judges code
    objects against it), else ``""``. ``hipRuntimeGetVersion`` gives ``HIP_VERSION``, major * 10^7 +
    minor * 10^5 + patch since ROCm 4.2; a smaller number is the older major * 100 + minor, not judged."""
    try:
        version = int(hip_call(hip.hipRuntimeGetVersion, call="hipRuntimeGetVersion"))
    except Exception as e:
        log.debug("no HIP runtime version: %s", getattr(e, "problem", e))
        return ""
    return f"HIP {version // 10_000_000}.{version // 100_000 % 100}" if version >= 10_000_000 else ""


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
            hip_call(self._backend._hip.hipFree, self.ptr, call="hipFree")
            self.freed = True
            self._backend._buffers.discard(self)


class HipKernel(Kernel):
    def __init__(self, name: str, function, module: "HipModule", params: tuple[KernelArg, ...] | None):
        self.name = name
        self.function = function
        self.params = params  # the explicit arguments the code object declares; None: unknown
        self._module = module  # keeps the module loaded while the kernel is in use


def check_against_params(kernel: HipKernel, args: Sequence[Any]) -> None:
    """Refuse arguments that do not match the kernel's declared parameters.

    A HIP launch copies whatever buffer it is given: a missing argument or a scalar of the
    wrong width shifts every later one, silently. The code object's metadata says what the
    kernel takes, so the launch checks count, kind (pointer or value) and width first.

    ``args`` have passed :func:`check_launch_args`: each is a HIP buffer or a NumPy scalar.

    Raises:
        LaunchArgumentError: naming the first mismatch and what the kernel expects.
    """
    params = kernel.params
    if params is None:
        return
    wanted = ", ".join("pointer" if p.value_kind == "global_buffer" else f"{p.size}-byte value" for p in params)
    if len(args) != len(params):
        raise LaunchArgumentError(f"{kernel.name} takes {len(params)} arguments ({wanted}), got {len(args)}",
                                  "pass one argument per kernel parameter, in order")
    for i, (arg, param) in enumerate(zip(args, params)):
        what = "a device buffer" if isinstance(arg, HipBuffer) else f"{arg.dtype} ({arg.dtype.itemsize} bytes)"
        if param.value_kind == "global_buffer":
            if not isinstance(arg, HipBuffer):
                raise LaunchArgumentError(f"{kernel.name}: argument {i} is {what}, but the kernel takes a pointer "
                                          "there", "pass a device buffer")
        elif isinstance(arg, HipBuffer) or arg.dtype.itemsize != param.size:
            raise LaunchArgumentError(f"{kernel.name}: argument {i} is {what}, but the kernel takes a "
                                      f"{param.size}-byte value there",
                                      "pass a NumPy scalar of the parameter's type, e.g. np.int32 or np.float32")


def _unload(hip, handle, image: bytes) -> None:
    """Unload a module; ``image`` rides along so that its bytes outlive the module."""
    try:
        hip_call(hip.hipModuleUnload, handle, call="hipModuleUnload")
    except Exception as e:  # at exit or after a device error: nothing left to do
        log.debug("hipModuleUnload: %s", e)


class HipModule(Module):
    """A code object loaded with ``hipModuleLoadData``; unloaded when collected or at ``close``.

    ROCm may keep reading the image it was given, so the module holds the very bytes object
    whose buffer it passed, until it is unloaded.
    """

    def __init__(self, backend: "HipBackend", handle, image: bytes):
        self._backend = backend
        self.handle = handle
        self.image = image
        self._params: dict[str, tuple[KernelArg, ...]] | None = None
        self._finalizer = weakref.finalize(self, _unload, backend._hip, handle, image)
        self._finalizer.atexit = False  # at exit ROCm tears its modules down itself, maybe before us

    def params(self, name: str) -> tuple[KernelArg, ...] | None:
        """Kernel ``name``'s explicit parameters from the metadata (read once per module).

        ``None`` when the metadata cannot be read: the launch then goes unchecked, as it
        would on CUDA, rather than refusing a binary the runtime accepted.
        """
        if self._params is None:
            try:
                kernels = read_code_object(self.image).kernels
                self._params = {k: meta.explicit_args for k, meta in kernels.items()}
            except BinaryLoadError as e:
                log.warning("launches of this code object go unchecked: %s", e.problem)
                self._params = {}
        return self._params.get(name)

    def unload(self) -> None:
        """Unload now (idempotent); its kernels can no longer be launched."""
        self._finalizer()

    def function(self, name: str) -> Kernel:
        if not self._finalizer.alive:
            raise BinaryLoadError(f"the code object holding {name!r} was unloaded", "load it again")
        self._backend._activate()
        try:
            fn = hip_call(self._backend._hip.hipModuleGetFunction, self.handle, name.encode(),
                          call="hipModuleGetFunction")
        except DeviceCallError as e:
            raise BinaryLoadError(
                f"no kernel {name!r} in this code object on {self._backend.device.name} ({e.problem})",
                "HIP kernels must be declared with KDB_KERNEL (extern \"C\") to keep their names") from e
        return HipKernel(name, fn, self, self.params(name))


class HipBackend(Backend):
    """One HIP device."""

    name = _SPEC.name
    binary_format = _SPEC.binary_format
    capabilities = _SPEC.capabilities

    def __init__(self, device: DeviceInfo):
        """Open ``device`` (as returned by :func:`discover`).

        Raises:
            BackendUnavailableError: no hip-python or no ROCm.
            DeviceCallError: the device cannot be queried.
        """
        if device.backend != "hip":
            raise BackendUnavailableError(f"{device.name} is a {device.backend} device, not a HIP one")
        self._hip = load_hip()
        self.device = device
        props = device_properties(self._hip, device.index)
        # What the hardware is, whatever KDB_DEVICE_ARCH says: code objects are checked against it.
        arch, features = parse_gcn_arch_name(props.gcnArchName)
        self.hardware_target = Target("hip", arch, features)
        self._modules: weakref.WeakSet[HipModule] = weakref.WeakSet()
        self._buffers: weakref.WeakSet[HipBuffer] = weakref.WeakSet()
        self._activate()

    def __repr__(self) -> str:
        return f"HipBackend({self.device.name!r}, {self.device.target})"

    def _activate(self) -> None:
        if self._hip is None:
            raise DeviceCallError(f"the HIP backend of {self.device.name} is closed", "open a new one")
        hip_call(self._hip.hipSetDevice, self.device.index, call="hipSetDevice")

    def load(self, binary: bytes) -> Module:
        """Load a code object after checking its target against this GPU.

        Raises:
            BinaryLoadError: not an AMD code object, built for another processor or with a
                feature setting the device lacks, or refused by the runtime.
        """
        data = binary if type(binary) is bytes else bytes(binary)
        arch = check_code_object(data, self.hardware_target, self.device.name).arch
        self._activate()
        try:
            handle = hip_call(self._hip.hipModuleLoadData, data, call="hipModuleLoadData")
        except DeviceCallError as e:
            raise BinaryLoadError(f"{self.device.name} refused a {arch} code object: {e.problem}",
                                  "the binary is damaged or needs a newer ROCm: rebuild it") from e
        module = HipModule(self, handle, data)
        self._modules.add(module)
        return module

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
        for i, arg in enumerate(args):
            if isinstance(arg, np.generic) and arg.dtype.kind == "f" and arg.dtype.itemsize > 8:
                # x86's long double is 16 bytes; amdgcn's is 8 (a double): every later argument would shift.
                raise LaunchArgumentError(
                    f"{kernel.name}: argument {i} is a {arg.dtype} ({arg.dtype.itemsize} bytes); long double is 8 "
                    "bytes on AMD GPUs", "pass np.float64(...) for a double or long double parameter")
        check_against_params(kernel, args)
        extra = tuple(a.ptr if isinstance(a, HipBuffer) else scalar_ctype(a) for a in args)
        self._activate()
        hip_call(
            self._hip.hipModuleLaunchKernel,
            kernel.function,
            *(int(g) for g in grid),
            *(int(b) for b in block),
            sharedMemBytes=int(shared_bytes),
            stream=None,
            kernelParams=None,
            extra=extra,
            call=f"hipModuleLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)})",
            error=LaunchError,
        )

    def alloc(self, nbytes: int) -> Buffer:
        self._activate()
        # hipMalloc(0) returns a null pointer; one byte keeps empty tensors legal.
        ptr = hip_call(self._hip.hipMalloc, max(int(nbytes), 1), call="hipMalloc")
        buf = HipBuffer(self, ptr, int(nbytes))
        self._buffers.add(buf)
        return buf

    def to_device(self, array: np.ndarray) -> Buffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        if host.nbytes:
            kind = self._hip.hipMemcpyKind.hipMemcpyHostToDevice
            hip_call(self._hip.hipMemcpy, buf.ptr, host, host.nbytes, kind, call="hipMemcpy(HostToDevice)",
                     error=TransferError)
        return buf

    def to_host(self, buffer: Buffer, out: np.ndarray) -> np.ndarray:
        if not isinstance(buffer, HipBuffer):
            raise LaunchArgumentError(f"{buffer!r} is not a HIP buffer of {self.device.name}")
        check_host_out(out, buffer.nbytes, self.device.name)
        self._activate()
        if out.nbytes:
            kind = self._hip.hipMemcpyKind.hipMemcpyDeviceToHost
            host = out if out.ndim else out.reshape(1)  # a 0-d array's one-element view, as CUDA's copy takes it
            hip_call(self._hip.hipMemcpy, host, buffer.ptr, out.nbytes, kind, call="hipMemcpy(DeviceToHost)",
                     error=TransferError)
        return out

    def synchronize(self) -> None:
        self._activate()
        hip_call(self._hip.hipDeviceSynchronize, call="hipDeviceSynchronize")

    def time_ms(self, fn, repeat: int = 1) -> float:
        """Time ``repeat`` calls of ``fn`` between two events on the null stream."""
        hip = self._hip
        self._activate()
        start = hip_call(hip.hipEventCreate, call="hipEventCreate")
        try:
            end = hip_call(hip.hipEventCreate, call="hipEventCreate")
            try:
                hip_call(hip.hipEventRecord, start, None, call="hipEventRecord")
                for _ in range(repeat):
                    fn()
                self._activate()
                hip_call(hip.hipEventRecord, end, None, call="hipEventRecord")
                hip_call(hip.hipEventSynchronize, end, call="hipEventSynchronize")
                ms = hip_call(hip.hipEventElapsedTime, start, end, call="hipEventElapsedTime")
            finally:
                hip.hipEventDestroy(end)
        finally:
            hip.hipEventDestroy(start)
        return float(ms) / max(repeat, 1)

    def close(self) -> None:
        """Wait for the device, then unload this backend's modules and free its buffers.

        HIP shares one primary context per device, which kdbkit does not release; unloading
        and freeing here leaves the device as closing a CUDA backend (which releases its
        context) does.
        """
        self.closed = True
        if self._hip is None:
            return
        self._activate()
        hip_call(self._hip.hipDeviceSynchronize, call="hipDeviceSynchronize")
        for module in list(self._modules):
            module.unload()
        for buf in list(self._buffers):
            buf.free()
        self._hip = None
