"""The CUDA backend: NVRTC to compile, the CUDA driver API (``cuda-bindings``) to run.

Devices are found through the driver (compute capability, SM count, PCI bus id) and named
through NVML when ``nvidia-ml-py`` is installed (marketing name, memory, driver version). A
missing driver or library means "no CUDA devices", never an error at import or discovery.

Binaries are cubins for exactly the device's arch. Before ``cuModuleLoadData`` the cubin's
ELF header is read (:func:`runtime.backends.elf_notes.cubin_arch`) and a cubin for another
arch is refused: SASS does not run across major versions, and refusing minor mismatches too
keeps one bundle per arch, as the bundle names promise.

Each call makes this backend's context current first, so several backends (devices) can be
used from one thread. Work goes to the context's legacy default stream, so copies
(``cuMemcpyHtoD``/``DtoH``, synchronous) and launches are ordered without extra syncs.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

import numpy as np

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.args import ParamBlock, check_host_out, check_launch_args, pack_launch_slots
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
from kdbkit.runtime.backends.elf_notes import cubin_arch
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.errors import DeviceCallError, LaunchArgumentError, LaunchError
from kdbkit.runtime.logging_setup import get_logger

log = get_logger(__name__)

_SPEC = spec_for("cuda")
_REMEDY = _SPEC.install_remedy
# What to do about a failed driver call depends on the error; these are the ones users meet.
_CALL_REMEDIES = {
    "CUDA_ERROR_OUT_OF_MEMORY": "free device memory, or use smaller tensors",
    "CUDA_ERROR_NO_DEVICE": "check that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)",
    "CUDA_ERROR_INVALID_DEVICE": "check the device index against `kdb devices`",
    "CUDA_ERROR_LAUNCH_FAILED": "the kernel faulted; run it under compute-sanitizer",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "the kernel read or wrote out of bounds; run it under compute-sanitizer",
    "CUDA_ERROR_INVALID_VALUE": "check the launch's grid, block and shared-memory sizes",
}


def _driver():
    """Import the driver binding lazily; importing kdbkit must not load libcuda."""
    try:
        from cuda.bindings import driver
    except Exception as e:
        raise BackendUnavailableError(f"cuda-bindings is not available ({e})", _REMEDY) from e
    return driver


def _check(result, call: str, driver, error: type[DeviceCallError] = DeviceCallError):
    """Unpack a driver ``(CUresult, *values)`` tuple; raise ``error`` naming ``call`` on any error."""
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        name = str(err)
        try:
            _, text = driver.cuGetErrorString(err)
            name = f"{err.name}: {text.decode() if isinstance(text, bytes) else text}"
        except Exception:
            pass  # the error string is a courtesy; the code itself is in `name`
        remedy = _CALL_REMEDIES.get(getattr(err, "name", ""), "see NVIDIA's documentation of that error")
        raise error(f"{call} failed ({name})", remedy)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def sm_arch(major: int, minor: int) -> str:
    """``sm_<major><minor>`` from a compute capability: (9, 0) -> ``sm_90``, (12, 1) -> ``sm_121``."""
    return f"sm_{major}{minor}"


def _attribute(driver, dev, name: str) -> int:
    """One ``CU_DEVICE_ATTRIBUTE_<name>`` of ``dev``."""
    attr = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(_check(driver.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({name})", driver))


def _optional_attribute(driver, dev, name: str) -> int:
    """As :func:`_attribute`, 0 where this driver or cuda-bindings lacks the attribute (the
    memory clock is deprecated in newer CUDA versions) or refuses it."""
    try:
        return _attribute(driver, dev, name)
    except Exception as e:  # AttributeError (no such enum member), DeviceCallError
        log.debug("cuDeviceGetAttribute(%s) unavailable: %s", name, e)
        return 0


def memory_system(driver, dev) -> MemorySystem:
    """The device's memory system as the driver reports it (:class:`MemorySystem`)."""
    return MemorySystem.from_clock(_optional_attribute(driver, dev, "MEMORY_CLOCK_RATE"),
                                   _optional_attribute(driver, dev, "GLOBAL_MEMORY_BUS_WIDTH"),
                                   _optional_attribute(driver, dev, "L2_CACHE_SIZE"),
                                   _optional_attribute(driver, dev, "MAX_THREADS_PER_MULTIPROCESSOR"))


def device_arch(driver, dev) -> str:
    """The ``sm_<NN>`` arch of a ``CUdevice``, from its compute capability."""
    major = _attribute(driver, dev, "COMPUTE_CAPABILITY_MAJOR")
    minor = _attribute(driver, dev, "COMPUTE_CAPABILITY_MINOR")
    return sm_arch(major, minor)


def discover() -> list[DeviceInfo]:
    """List CUDA devices in CUDA ordinal order; an empty list when there is no usable driver.

    Never raises: a missing cuda-bindings, libcuda or GPU means no CUDA devices.
    """
    try:
        driver = _driver()
        (err,) = driver.cuInit(0)
    except Exception as e:  # BackendUnavailableError, or libcuda not found when the call loads it
        log.debug("no CUDA devices: %s", e)
        return []
    if err != driver.CUresult.CUDA_SUCCESS:
        log.debug("no CUDA devices: cuInit returned %s", err)
        return []
    try:
        count = _check(driver.cuDeviceGetCount(), "cuDeviceGetCount", driver)
    except Exception as e:
        log.warning("CUDA driver present but cuDeviceGetCount failed: %s", e)
        return []
    nvml = _NvmlNames()
    try:
        devices = []
        for ordinal in range(count):
            try:
                devices.append(_device_info(driver, ordinal, nvml))
            except Exception as e:
                log.warning("skipping CUDA device %d: %s", ordinal, e)
        return devices
    finally:
        nvml.close()


def _device_info(driver, ordinal: int, nvml: "_NvmlNames") -> DeviceInfo:
    dev = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet", driver)
    sms = _attribute(driver, dev, "MULTIPROCESSOR_COUNT")
    name = _check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName", driver)
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    memory = int(_check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem", driver))
    # NVML numbers devices by PCI order, CUDA by speed: match the two by PCI bus id.
    bus_id = _check(driver.cuDeviceGetPCIBusId(64, dev), "cuDeviceGetPCIBusId", driver)
    bus_id = bus_id.split(b"\0", 1)[0].decode() if isinstance(bus_id, bytes) else str(bus_id)
    nv_name, nv_memory = nvml.lookup(bus_id)
    version = _check(driver.cuDriverGetVersion(), "cuDriverGetVersion", driver)
    driver_text = nvml.driver_version() or f"CUDA {version // 1000}.{(version % 1000) // 10}"
    return DeviceInfo(
        backend="cuda",
        index=ordinal,
        name=nv_name or name,
        target=Target("cuda", device_arch(driver, dev), (), sms),
        memory_bytes=nv_memory or memory,
        driver=driver_text,
        runtime=f"CUDA {version // 1000}.{(version % 1000) // 10}",
        memory=memory_system(driver, dev),
    )


def check_cubin(data: bytes, hardware_arch: str, device_name: str) -> str:
    """Check, from its ELF header, that a cubin runs on a GPU of ``hardware_arch``.

    Args:
        data: the binary.
        hardware_arch: the GPU's ``sm_<NN>`` from its compute capability.
        device_name: for messages.

    Returns:
        The cubin's arch.

    Raises:
        BinaryLoadError: not a cubin (garbage, PTX text, a fatbin, an AMD code object), or
            built for another arch.
    """
    built_for = cubin_arch(data, what=f"binary for {device_name}")
    if built_for == hardware_arch:
        return built_for  # the common case, on every load: skip building Target objects
    reason = Target("cuda", hardware_arch).accepts(Target("cuda", built_for))
    if reason is not None:
        raise BinaryLoadError(
            f"{device_name} is {hardware_arch} but this cubin was built for {built_for} ({reason})",
            f"rebuild it for {hardware_arch}")
    return built_for


class _NvmlNames:
    """NVML, if installed, for names, memory and the driver version; silent when absent."""

    def __init__(self):
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as e:  # no nvidia-ml-py, or no libnvidia-ml
            log.debug("NVML unavailable: %s", e)

    def lookup(self, bus_id: str) -> tuple[str | None, int | None]:
        if self._nvml is None:
            return None, None
        try:
            handle = self._nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            name = self._nvml.nvmlDeviceGetName(handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle).total
            return (name.decode() if isinstance(name, bytes) else name), int(memory)
        except Exception as e:
            log.debug("NVML has no device at %s: %s", bus_id, e)
            return None, None

    def driver_version(self) -> str | None:
        if self._nvml is None:
            return None
        try:
            version = self._nvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else version
        except Exception:
            return None

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


class CudaBuffer(Buffer):
    """``nbytes`` of device memory from ``cuMemAlloc``, or another library's memory (not owned)."""

    def __init__(self, backend: "CudaBackend", ptr, nbytes: int, owned: bool = True):
        self._backend = backend
        self.ptr = ptr
        self.nbytes = nbytes
        self.freed = False
        self.owned = owned  # False: PyTorch's or CuPy's memory, used in place; never freed here

    def free(self) -> None:
        if not self.freed and self.owned:
            self._backend._activate()
            _check(self._backend._drv.cuMemFree(self.ptr), "cuMemFree", self._backend._drv)
        self.freed = True


class CudaKernel(Kernel):
    def __init__(self, name: str, function, module: "CudaModule"):
        self.name = name
        self.function = function
        self._module = module  # keeps the module loaded while the kernel is in use
        self.dynamic_shared_limit = 48 * 1024  # what a launch may ask for before the kernel opts in to more


class CudaModule(Module):
    """A cubin loaded with ``cuModuleLoadData``."""

    def __init__(self, backend: "CudaBackend", handle):
        self._backend = backend
        self.handle = handle

    def function(self, name: str) -> Kernel:
        drv = self._backend._drv
        self._backend._activate()
        err, fn = drv.cuModuleGetFunction(self.handle, name.encode())
        if err != drv.CUresult.CUDA_SUCCESS:
            raise BinaryLoadError(
                f"no kernel {name!r} in this cubin on {self._backend.device.name} ({err.name})",
                "CUDA kernels must be declared with KDB_KERNEL (extern \"C\") to keep their names")
        return CudaKernel(name, fn, self)


def _swizzle(drv, swizzle: int):
    """The driver's swizzle mode for a span of ``swizzle`` bytes (128, 64 or 32)."""
    if swizzle not in (128, 64, 32):
        raise LaunchArgumentError(f"tensor map: a {swizzle}-byte swizzle (128, 64 or 32 bytes)")
    return getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}B")


class CudaBackend(Backend):
    """One CUDA device, through its primary context."""

    name = _SPEC.name
    binary_format = _SPEC.binary_format
    capabilities = _SPEC.capabilities  # streams (self.stream), occupancy (resident_groups), wrap

    def __init__(self, device: DeviceInfo):
        """Open ``device`` (as returned by :func:`discover`): retain its primary context.

        Raises:
            BackendUnavailableError: no driver, or the device cannot be opened.
        """
        if device.backend != "cuda":
            raise BackendUnavailableError(f"{device.name} is a {device.backend} device, not a CUDA one")
        drv = _driver()
        try:
            _check(drv.cuInit(0), "cuInit", drv)
        except DeviceCallError:
            raise
        except Exception as e:
            raise BackendUnavailableError(f"the CUDA driver cannot be loaded ({e})", _REMEDY) from e
        self._drv = drv
        self.device = device
        self.stream = 0  # the CUstream launches and timings go to (Handle.set_stream); 0: legacy default
        self._dev = _check(drv.cuDeviceGet(device.index), "cuDeviceGet", drv)
        # What the hardware runs, whatever KDB_DEVICE_ARCH says: cubins are checked against it.
        self.hardware_arch = device_arch(drv, self._dev)
        self._ctx = _check(drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain", drv)
        self._ctx_id = int(self._ctx)
        self._cubin_headers: set[bytes] = set()  # ELF header fields of cubins already accepted
        self._activate()

    def __repr__(self) -> str:
        return f"CudaBackend({self.device.name!r}, {self.device.target})"

    def _activate(self) -> None:
        # Asking is cheaper than setting, and the context is almost always current already;
        # another library may have changed it.
        err, current = self._drv.cuCtxGetCurrent()
        if err != self._drv.CUresult.CUDA_SUCCESS or int(current) != self._ctx_id:
            _check(self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent", self._drv)

    def close(self) -> None:
        """Release the primary context (buffers and modules of this backend become invalid)."""
        self.closed = True
        if self._ctx is not None:
            self._ctx, ctx = None, self._ctx
            self._ctx_id = None
            _check(self._drv.cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease", self._drv)
            del ctx

    def load(self, binary: bytes) -> Module:
        """Load a cubin after checking, from its ELF header, that it was built for this GPU.

        Raises:
            BinaryLoadError: not a cubin, built for another arch, or refused by the driver.
        """
        data = binary if isinstance(binary, bytes) else bytes(binary)
        # The arch check reads only ident, machine and flags: a cubin whose fields equal
        # those of one already accepted passes without parsing again (ELF64 only, where
        # e_flags sits at byte 48).
        header = data[:20] + data[48:52]
        if header not in self._cubin_headers:
            check_cubin(data, self.hardware_arch, self.device.name)
            if data[4] == 2:
                self._cubin_headers.add(header)
        self._activate()
        err, module = self._drv.cuModuleLoadData(data)
        if err != self._drv.CUresult.CUDA_SUCCESS:
            raise BinaryLoadError(f"cuModuleLoadData refused a {cubin_arch(data)} cubin on {self.device.name} "
                                  f"({err.name})", "the binary is damaged or needs a newer driver: rebuild it")
        return CudaModule(self, module)

    def launch(
        self,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_bytes: int = 0,
    ) -> None:
        """``cuLaunchKernel`` with ``kernelParams``: an array of pointers to each argument's bytes."""
        if not isinstance(kernel, CudaKernel):
            raise LaunchArgumentError(f"{kernel!r} was not loaded by the CUDA backend")
        check_launch_args(kernel.name, args, CudaBuffer, blocks=True)
        # One C buffer with a slot per argument holding its bytes (a device pointer is 8 bytes,
        # a scalar at most 8, little-endian from the slot's start; a parameter block its own
        # size, aligned as it asks); the driver copies them during the call, so they only need
        # to outlive it. One buffer, not one per argument: building the arguments was a large
        # share of a launch's host time.
        holders, offsets = pack_launch_slots(args, CudaBuffer)
        base = ctypes.addressof(holders)
        pointers = (ctypes.c_void_p * max(len(args), 1))(*(base + o for o in offsets))
        self._activate()
        self._allow_shared(kernel, shared_bytes)
        _check(
            self._drv.cuLaunchKernel(
                kernel.function,
                *(int(g) for g in grid),
                *(int(b) for b in block),
                int(shared_bytes),
                self.stream,  # 0: the legacy default stream, which PyTorch and CuPy also use by default
                ctypes.addressof(pointers) if args else 0,
                0,
            ),
            f"cuLaunchKernel({kernel.name}, grid={tuple(grid)}, block={tuple(block)})",
            self._drv, LaunchError,
        )

    def _allow_shared(self, kernel: "CudaKernel", shared_bytes: int) -> None:
        if shared_bytes > kernel.dynamic_shared_limit:
            # Over 48 KiB of dynamic shared memory is opt-in per kernel (sm_70+), once.
            attribute = self._drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(self._drv.cuFuncSetAttribute(kernel.function, attribute, int(shared_bytes)),
                   f"cuFuncSetAttribute({kernel.name}, max dynamic shared memory {shared_bytes})", self._drv, LaunchError)
            kernel.dynamic_shared_limit = int(shared_bytes)

    def launcher(self, kernel: Kernel, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: Sequence[Any], shared_bytes: int = 0, cooperative: bool = False):
        """The fixed arguments packed once into the parameter slots; a run writes only the
        buffers' addresses (under a lock: the slots are shared) and calls cuLaunchKernel.
        ``cooperative``: cuLaunchCooperativeKernel, for kernels whose groups wait on each other
        (the driver refuses a grid whose groups could not all be resident at once).
        The run's ``rebound(*blocks)``: the same launch with its parameter blocks replaced, in
        order (each of the same size and alignment), its slots copied rather than packed again:
        a TMA kernel's launch for other tensors (a tensor map holds its tensor's address)."""
        if not isinstance(kernel, CudaKernel):
            raise LaunchArgumentError(f"{kernel!r} was not loaded by the CUDA backend")
        check_launch_args(kernel.name, [a for a in args if a is not None], CudaBuffer, blocks=True)
        holders, offsets = pack_launch_slots([CudaBuffer(self, 0, 0, owned=False) if a is None else a for a in args],
                                             CudaBuffer)
        self._activate()
        self._allow_shared(kernel, shared_bytes)
        return self._slots_run(kernel, grid, block, list(args), holders, offsets, shared_bytes, cooperative)

    def _slots_run(self, kernel: "CudaKernel", grid, block, args: list, holders: ctypes.Array, offsets: list[int],
                   shared_bytes: int, cooperative: bool):
        """:meth:`launcher`'s run over ``args`` packed in ``holders`` at ``offsets``."""
        slots = [offsets[i] // 8 for i, a in enumerate(args) if a is None]  # the run-time buffers' words
        words = (ctypes.c_uint64 * (len(holders) // 8)).from_buffer(holders)
        base = ctypes.addressof(holders)
        pointers = (ctypes.c_void_p * max(len(args), 1))(*(base + o for o in offsets))
        params = ctypes.addressof(pointers) if args else 0
        dims = (*(int(g) for g in grid), *(int(b) for b in block))
        lock, drv, function, what = threading.Lock(), self._drv, kernel.function, kernel.name
        call = "cuLaunchCooperativeKernel" if cooperative else "cuLaunchKernel"
        launch = drv.cuLaunchCooperativeKernel if cooperative else drv.cuLaunchKernel
        shared = int(shared_bytes)
        tail = () if cooperative else (0,)  # the cooperative call takes no `extra`

        def run(*buffers: Buffer) -> None:
            for buffer in buffers:
                if not isinstance(buffer, CudaBuffer) or buffer.freed:
                    check_launch_args(what, buffers, CudaBuffer)  # raises, naming the argument
            with lock:
                for i, buffer in zip(slots, buffers):
                    words[i] = int(buffer.ptr)
                self._activate()
                err, = launch(function, *dims, shared, self.stream, params, *tail)
                if err != drv.CUresult.CUDA_SUCCESS:
                    _check((err,), f"{call}({what}, grid={tuple(grid)}, block={tuple(block)})", drv, LaunchError)

        def rebound(*blocks: ParamBlock):
            places = [i for i, a in enumerate(args) if isinstance(a, ParamBlock)]
            if len(blocks) != len(places) or any(
                    not isinstance(b, ParamBlock) or len(b.data) != len(args[i].data) or b.align != args[i].align
                    for b, i in zip(blocks, places)):
                raise LaunchArgumentError(f"{what}: a rebound launch takes {len(places)} parameter blocks of the "
                                          f"sizes and alignments of its own ({[len(args[i].data) for i in places]} "
                                          "bytes)")
            if not places:
                return run
            copy = ctypes.create_string_buffer(len(holders))
            widest = max([8, *(args[i].align for i in places)])
            shift = -ctypes.addressof(copy) % widest - offsets[0]  # the first argument's slot starts the aligned run
            ctypes.memmove(ctypes.addressof(copy) + offsets[0] + shift, base + offsets[0], len(holders) - widest)
            moved = [o + shift for o in offsets]
            given = list(args)
            for b, i in zip(blocks, places):
                ctypes.memmove(ctypes.addressof(copy) + moved[i], b.data, len(b.data))
                given[i] = b
            return self._slots_run(kernel, grid, block, given, copy, moved, shared_bytes, cooperative)

        run.rebound = rebound
        run.keep = (holders, pointers)  # the slots live as long as the launcher
        return run

    def resident_groups(self, kernel: Kernel, block_threads: int, shared_bytes: int = 0) -> int:
        """How many groups of ``block_threads`` threads with ``shared_bytes`` of dynamic shared
        memory one multiprocessor holds at once (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        if not isinstance(kernel, CudaKernel):
            raise LaunchArgumentError(f"{kernel!r} was not loaded by the CUDA backend")
        self._activate()
        self._allow_shared(kernel, shared_bytes)
        return int(_check(self._drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            kernel.function, int(block_threads), int(shared_bytes)),
            f"cuOccupancyMaxActiveBlocksPerMultiprocessor({kernel.name})", self._drv, LaunchError))

    def tensor_map(self, address: int, element_bytes: int, dims: Sequence[int], strides: Sequence[int],
                   box: Sequence[int], swizzle: int = 128) -> ParamBlock:
        """A TMA tensor map (``cuTensorMapEncodeTiled``) over device memory at ``address``, with
        the ``swizzle``-byte swizzle (128, 64 or 32) and zero fill past the edges, as a kernel's
        by-value parameter.

        Args:
            address: the tensor's first element (16-byte aligned).
            element_bytes: 1, 2, 4 or 8 (the map only moves bits; zero fill is all-zero bits).
            dims: elements along each dimension, the contiguous one first (1 to 5 of them).
            strides: bytes between consecutive indices of each dimension after the first
                (multiples of 16).
            box: the elements one copy moves along each dimension (at most 256 each; the
                first at most ``swizzle`` bytes, the swizzle's span).
            swizzle: the swizzle's span in bytes: 128, 64 or 32 (a K-major wgmma tile's row).

        Raises:
            LaunchArgumentError: the driver refused the map (its message names why).
        """
        drv = self._drv
        types = {1: "UINT8", 2: "UINT16", 4: "UINT32", 8: "UINT64"}
        if element_bytes not in types or not 1 <= len(dims) <= 5 or len(strides) != len(dims) - 1 \
                or len(box) != len(dims):
            raise LaunchArgumentError(f"tensor map: {element_bytes}-byte elements, dims {tuple(dims)}, strides "
                                      f"{tuple(strides)}, box {tuple(box)} do not describe a tensor of 1 to 5 "
                                      "dimensions")
        kind = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{types[element_bytes]}")
        self._activate()
        encoded = _check(drv.cuTensorMapEncodeTiled(
            kind, len(dims), int(address), [drv.cuuint64_t(int(d)) for d in dims],
            [drv.cuuint64_t(int(s)) for s in strides], [drv.cuuint32_t(int(b)) for b in box],
            [drv.cuuint32_t(1)] * len(dims), drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _swizzle(drv, swizzle),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            f"cuTensorMapEncodeTiled(dims={tuple(dims)}, strides={tuple(strides)}, box={tuple(box)})", drv,
            LaunchArgumentError)
        return ParamBlock(ctypes.string_at(encoded.getPtr(), 128), 64)

    def tensor_map_im2col(self, address: int, element_bytes: int, dims: Sequence[int], strides: Sequence[int],
                          lower: Sequence[int], upper: Sequence[int], channels: int, pixels: int,
                          element_strides: Sequence[int], swizzle: int = 128) -> ParamBlock:
        """A TMA tensor map in im2col mode (``cuTensorMapEncodeIm2col``) over a channels-last
        tensor at ``address``, with the ``swizzle``-byte swizzle and zero fill past the edges, as a
        kernel's by-value parameter. A copy through it moves ``channels`` channels of
        ``pixels`` pixels, walked from the copy's coordinates through the bounding box
        (``lower`` .. the tensor's far edge plus ``upper``) in steps of ``element_strides``.

        Args:
            address: the tensor's first element (16-byte aligned).
            element_bytes: 1, 2, 4 or 8.
            dims: elements along each dimension, channels first (3 to 5 of them: C, W, (H, (D,)) N).
            strides: bytes between consecutive indices of each dimension after the first
                (multiples of 16).
            lower, upper: the bounding box's corners along the spatial dimensions, innermost
                first (W, H, D): -pad, and pad - dilation x (filter - 1), for a convolution;
                within [-128, 127] for a 4-D tensor.
            channels: channels a copy moves per pixel (at most ``swizzle`` bytes of them, the swizzle's span).
            pixels: pixels a copy moves (at most 1024).
            element_strides: the traversal's step along each dimension (1 for channels and
                images; a convolution's strides along W, H), each 1 to 8.
            swizzle: the swizzle's span in bytes: 128, 64 or 32.

        Raises:
            LaunchArgumentError: the driver refused the map (its message names why).
        """
        drv = self._drv
        types = {1: "UINT8", 2: "UINT16", 4: "UINT32", 8: "UINT64"}
        spatial = len(dims) - 2
        if element_bytes not in types or not 3 <= len(dims) <= 5 or len(strides) != len(dims) - 1 \
                or len(lower) != spatial or len(upper) != spatial or len(element_strides) != len(dims):
            raise LaunchArgumentError(f"im2col tensor map: {element_bytes}-byte elements, dims {tuple(dims)}, strides "
                                      f"{tuple(strides)}, corners {tuple(lower)} {tuple(upper)}, element strides "
                                      f"{tuple(element_strides)} do not describe a tensor of 3 to 5 dimensions")
        kind = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{types[element_bytes]}")
        self._activate()
        what = (f"cuTensorMapEncodeIm2col(dims={tuple(dims)}, strides={tuple(strides)}, lower={tuple(lower)}, "
                f"upper={tuple(upper)}, channels={channels}, pixels={pixels}, "
                f"element strides={tuple(element_strides)})")
        encoded = _check(drv.cuTensorMapEncodeIm2col(
            kind, len(dims), int(address), [drv.cuuint64_t(int(d)) for d in dims],
            [drv.cuuint64_t(int(s)) for s in strides], [int(v) for v in lower], [int(v) for v in upper],
            int(channels), int(pixels), [drv.cuuint32_t(int(e)) for e in element_strides],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _swizzle(drv, swizzle),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), what, drv, LaunchArgumentError)
        return ParamBlock(ctypes.string_at(encoded.getPtr(), 128), 64)

    def wrap(self, ptr: int, nbytes: int) -> Buffer:
        """Another library's device memory (a PyTorch or CuPy tensor's), used in place, never freed here."""
        return CudaBuffer(self, int(ptr), int(nbytes), owned=False)

    def alloc(self, nbytes: int) -> Buffer:
        self._activate()
        # cuMemAlloc refuses 0 bytes; one byte keeps empty tensors legal.
        ptr = _check(self._drv.cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc", self._drv)
        return CudaBuffer(self, ptr, int(nbytes))

    def to_device(self, array: np.ndarray) -> Buffer:
        host = np.ascontiguousarray(array)
        buf = self.alloc(host.nbytes)
        if host.nbytes:
            _check(self._drv.cuMemcpyHtoD(buf.ptr, host, host.nbytes), "cuMemcpyHtoD", self._drv)
        return buf

    def to_host(self, buffer: Buffer, out: np.ndarray) -> np.ndarray:
        if not isinstance(buffer, CudaBuffer):
            raise LaunchArgumentError(f"{buffer!r} is not a CUDA buffer of {self.device.name}")
        check_host_out(out, buffer.nbytes, self.device.name)
        self._activate()
        if out.nbytes:
            # a 0-d array is no buffer the binding takes: copy into its one-element view
            _check(self._drv.cuMemcpyDtoH(out if out.ndim else out.reshape(1), buffer.ptr, out.nbytes), "cuMemcpyDtoH",
                   self._drv)
        return out

    def synchronize(self) -> None:
        self._activate()
        _check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize", self._drv)

    def time_ms(self, fn, repeat: int = 1) -> float:
        """Time ``repeat`` calls of ``fn`` between two events on this backend's stream."""
        drv = self._drv
        self._activate()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT
        start = _check(drv.cuEventCreate(flags), "cuEventCreate", drv)
        end = _check(drv.cuEventCreate(flags), "cuEventCreate", drv)
        try:
            _check(drv.cuEventRecord(start, self.stream), "cuEventRecord", drv)
            for _ in range(repeat):
                fn()
            self._activate()
            _check(drv.cuEventRecord(end, self.stream), "cuEventRecord", drv)
            _check(drv.cuEventSynchronize(end), "cuEventSynchronize", drv)
            ms = _check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime", drv)
        finally:
            drv.cuEventDestroy(start)
            drv.cuEventDestroy(end)
        return float(ms) / max(repeat, 1)
