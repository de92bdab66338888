"""Device discovery across vendors, the environment overrides, and opening a backend for a device.

Order: CUDA devices, then HIP, then OpenCL. ``KDB_BACKEND`` (``cuda``, ``hip``, ``opencl``, or
a comma-separated list) restricts which vendors are asked. Each vendor module imports its
library inside its ``discover()``, and a missing library means no devices of that vendor, so
discovery never fails for want of a vendor library.

Overrides, for offline work and for devices whose reported facts are wrong:

- ``KDB_DEVICE_ARCH`` replaces the arch (and target features) of every discovered device of
  the backend that arch belongs to: ``gfx90a:xnack-`` changes HIP devices, ``sm_80`` CUDA ones.
  A CU count may ride along (``gfx90a_110``).
- ``KDB_DEVICE_CU`` replaces the compute-unit count: of the devices ``KDB_DEVICE_ARCH`` changed
  when it is set, else of every device.

The overrides change ``DeviceInfo.target``, which picks bundles and compile targets; backends
still check loaded binaries against what the hardware really is.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import replace
from typing import Callable

from kdbkit.kdb.errors import BundleNameError, KdbError
from kdbkit.kdb.target import BACKENDS, Target
from kdbkit.runtime.backends.base import Backend, BackendUnavailableError, DeviceInfo

ENV_BACKEND = "KDB_BACKEND"
ENV_DEVICE_ARCH = "KDB_DEVICE_ARCH"
ENV_DEVICE_CU = "KDB_DEVICE_CU"


class DeviceOverrideError(KdbError, ValueError):
    """``KDB_BACKEND``, ``KDB_DEVICE_ARCH`` or ``KDB_DEVICE_CU`` holds a value that cannot be used."""


def _discover_cuda() -> list[DeviceInfo]:
    from kdbkit.runtime.backends import cuda

    return cuda.discover()


def _discover_hip() -> list[DeviceInfo]:
    from kdbkit.runtime.backends import hip

    return hip.discover()


def _discover_opencl() -> list[DeviceInfo]:
    from kdbkit.runtime.backends import opencl

    return opencl.discover()


# The discovery order is the order of this mapping: GPUs of the native APIs before OpenCL.
DISCOVERERS: dict[str, Callable[[], list[DeviceInfo]]] = {
    "cuda": _discover_cuda,
    "hip": _discover_hip,
    "opencl": _discover_opencl,
}


def selected_backends(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The backends ``KDB_BACKEND`` allows, in discovery order (all when it is unset or empty).

    Raises:
        DeviceOverrideError: it names a backend that does not exist.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_BACKEND, "").strip().lower()
    if not raw:
        return tuple(DISCOVERERS)
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = wanted - set(BACKENDS)
    if unknown:
        raise DeviceOverrideError(
            f"{ENV_BACKEND}={raw!r} names unknown backend(s) {', '.join(sorted(unknown))}; "
            f"use one or more of {', '.join(BACKENDS)}, comma-separated, or unset it"
        )
    return tuple(b for b in DISCOVERERS if b in wanted)


def apply_overrides(devices: list[DeviceInfo], environ: dict[str, str] | None = None) -> list[DeviceInfo]:
    """Apply ``KDB_DEVICE_ARCH`` / ``KDB_DEVICE_CU`` to discovered devices (a pure function).

    Args:
        devices: as discovered.
        environ: the environment to read; ``os.environ`` by default.

    Returns:
        The devices, with targets replaced where an override applies.

    Raises:
        DeviceOverrideError: a value does not parse (a malformed arch, a non-positive CU count).
    """
    env = os.environ if environ is None else environ
    arch_text = env.get(ENV_DEVICE_ARCH, "").strip()
    cu_text = env.get(ENV_DEVICE_CU, "").strip()
    if not arch_text and not cu_text:
        return devices
    override: Target | None = None
    if arch_text:
        try:
            override = Target.parse(arch_text)
        except BundleNameError as e:
            raise DeviceOverrideError(
                f"{ENV_DEVICE_ARCH}={arch_text!r} is not an arch: {e}; e.g. gfx90a:xnack-, sm_90 or gfx942_304"
            ) from e
    cu: int | None = None
    if cu_text:
        if not cu_text.isdigit() or int(cu_text) <= 0:
            raise DeviceOverrideError(f"{ENV_DEVICE_CU}={cu_text!r} must be a positive integer, e.g. 110")
        cu = int(cu_text)
    elif override is not None and override.cu is not None:
        cu = override.cu

    result = []
    for dev in devices:
        target = dev.target
        if override is not None:
            if override.backend != dev.backend:
                result.append(dev)  # an arch of another vendor says nothing about this device
                continue
            target = replace(target, arch=override.arch, features=override.features)
        if cu is not None:
            target = replace(target, cu=cu)
        result.append(replace(dev, target=target))
    return result


def discover_devices() -> list[DeviceInfo]:
    """List local devices: CUDA, then HIP, then OpenCL, with the environment's overrides applied.

    Returns:
        Possibly empty; the same physical GPU may appear twice, once through its native API
        and once through an OpenCL driver.

    Raises:
        DeviceOverrideError: ``KDB_BACKEND``/``KDB_DEVICE_ARCH``/``KDB_DEVICE_CU`` is malformed.
    """
    devices: list[DeviceInfo] = []
    for backend in selected_backends():
        devices.extend(DISCOVERERS[backend]())
    return apply_overrides(devices)


def default_device(devices: list[DeviceInfo] | None = None) -> DeviceInfo:
    """The device to use when none is named: the first GPU, else the first OpenCL device.

    Args:
        devices: candidates in discovery order; :func:`discover_devices` by default.

    Raises:
        BackendUnavailableError: there is no device at all; the message says how to get one.
    """
    found = discover_devices() if devices is None else devices
    for dev in found:
        if dev.backend in ("cuda", "hip"):
            return dev
    for dev in found:
        if dev.backend == "opencl":
            return dev
    allowed = selected_backends()
    restricted = f" ({ENV_BACKEND} allows only {', '.join(allowed)})" if len(allowed) < len(DISCOVERERS) else ""
    raise BackendUnavailableError(
        f"no GPU and no OpenCL device found{restricted}; install the CPU device with "
        "`pip install 'kdbkit[opencl]'`, or the GPU extras `kdbkit[cuda]` / `kdbkit[hip]` with their drivers"
    )


# Where each backend class lives; imported on first use (the modules load no vendor library).
_BACKEND_CLASSES = {
    "cuda": ("kdbkit.runtime.backends.cuda", "CudaBackend"),
    "hip": ("kdbkit.runtime.backends.hip", "HipBackend"),
    "opencl": ("kdbkit.runtime.backends.opencl", "OpenCLBackend"),
}


def _backend_class(backend: str, what: str) -> type[Backend]:
    if backend not in _BACKEND_CLASSES:
        raise BackendUnavailableError(f"unknown backend {backend!r} for {what}; expected one of {', '.join(BACKENDS)}")
    module, name = _BACKEND_CLASSES[backend]
    return getattr(importlib.import_module(module), name)


def open_backend(device: DeviceInfo) -> Backend:
    """Open the backend that drives ``device``.

    Raises:
        BackendUnavailableError: the vendor library is missing or the device cannot be opened.
    """
    return _backend_class(device.backend, device.name)(device)


def binary_format_of(backend: str) -> str:
    """The binary format a backend loads, as recorded in bundles (``cubin``, ``hsaco``, ``ocl-binary``)."""
    return _backend_class(backend, "a binary format").binary_format
