"""Device discovery across vendors, the environment overrides, and opening a backend for a device.

Order: CUDA devices, then HIP, then OpenCL. ``KDB_BACKEND`` (``cuda``, ``hip``, ``opencl``, or
a comma-separated list) restricts which vendors are asked. Each vendor module imports its
library inside its ``discover()``, and a missing library means no devices of that vendor, so
discovery never fails for want of a vendor library. Every variable is parsed by
:mod:`kdbkit.runtime.env`; a malformed one warns once and is ignored.

Overrides, for offline work and for devices whose reported facts are wrong:

- ``KDB_DEVICE_ARCH`` replaces the arch (and target features) of every discovered device of
  the backend that arch belongs to: ``gfx90a:xnack-`` changes HIP devices, ``sm_80`` CUDA ones,
  ``ocl-<hex>`` OpenCL ones. A CU count may ride along (``gfx90a_110``).
- ``KDB_DEVICE_CU`` replaces the compute-unit count: of the devices ``KDB_DEVICE_ARCH`` changed
  when it is set, else of every device.

An override that reaches no device (an AMD arch on a machine with only OpenCL devices) says so
once. The overrides change ``DeviceInfo.target``, which picks bundles and compile targets;
backends still check loaded binaries against what the hardware really is.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Callable

from kdbkit.kdb.target import Target
from kdbkit.runtime import env, paths
from kdbkit.runtime.backends.base import Backend, BackendUnavailableError, DeviceInfo
from kdbkit.runtime.backends.spec import discoverers, spec_for
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.logging_setup import get_logger, warn_once

_log = get_logger(__name__)


# The discovery order is the order of the specs: GPUs of the native APIs before OpenCL.
DISCOVERERS: dict[str, Callable[[], list[DeviceInfo]]] = discoverers()


def selected_backends() -> tuple[str, ...]:
    """The backends ``KDB_BACKEND`` allows, in discovery order (all when it is unset or invalid)."""
    return env.get_choices("KDB_BACKEND") or tuple(DISCOVERERS)


@dataclass(frozen=True)
class Overrides:
    """``KDB_DEVICE_ARCH`` and ``KDB_DEVICE_CU`` as parsed; both None when unset."""

    arch: Target | None
    cu: int | None

    @classmethod
    def from_env(cls) -> "Overrides":
        arch = env.get_target("KDB_DEVICE_ARCH")
        cu = env.get_int("KDB_DEVICE_CU")
        return cls(arch, cu if cu is not None else (arch.cu if arch is not None else None))


def apply_overrides(devices: list[DeviceInfo], overrides: Overrides | None = None) -> list[DeviceInfo]:
    """Apply ``KDB_DEVICE_ARCH`` / ``KDB_DEVICE_CU`` to discovered devices.

    Args:
        devices: as discovered.
        overrides: the overrides to apply; read from the environment by default.

    Returns:
        The devices, with targets replaced where an override applies. An arch override that
        matches no device's backend warns once (it would otherwise do nothing, silently).
    """
    o = overrides or Overrides.from_env()
    if o.arch is None and o.cu is None:
        return devices
    result, touched = [], 0
    for dev in devices:
        target = dev.target
        if o.arch is not None:
            if o.arch.backend != dev.backend:
                result.append(dev)  # an arch of another vendor says nothing about this device
                continue
            target = replace(target, arch=o.arch.arch, features=o.arch.features)
        if o.cu is not None:
            target = replace(target, cu=o.cu)
        touched += 1
        result.append(replace(dev, target=target))
    if o.arch is not None and devices and not touched:
        found = ", ".join(sorted({d.backend for d in devices}))
        warn_once(f"override-unused:{o.arch}",
                  f"KDB_DEVICE_ARCH={o.arch} names a {o.arch.backend} arch but the devices here are {found}: "
                  f"it changes nothing (KDB_DEVICE_CU neither); unset it, or name an arch of a device "
                  f"`kdb devices` lists", logger=_log)
    return result


def discover_devices() -> list[DeviceInfo]:
    """List local devices: CUDA, then HIP, then OpenCL, with the environment's overrides applied.

    Returns:
        Possibly empty; the same physical GPU may appear twice, once through its native API
        and once through an OpenCL driver.
    """
    devices: list[DeviceInfo] = []
    for backend in selected_backends():
        devices.extend(DISCOVERERS[backend]())
    devices = apply_overrides(devices)
    _log.info2("devices: %s", ", ".join(f"{d.backend} {d.name} ({d.target})" for d in devices) or "none")
    return devices


def hidden_by_kdb_backend() -> list[DeviceInfo]:
    """Devices of the backends ``KDB_BACKEND`` leaves out (for messages that say what it hides)."""
    allowed = selected_backends()
    return [d for backend in DISCOVERERS if backend not in allowed for d in DISCOVERERS[backend]()]


def no_device_error() -> BackendUnavailableError:
    """The error for "no device at all", naming what ``KDB_BACKEND`` hides when it hides something."""
    allowed = selected_backends()
    if len(allowed) < len(DISCOVERERS):
        hidden = hidden_by_kdb_backend()
        if hidden:
            kinds = ", ".join(sorted({d.backend for d in hidden}))
            return BackendUnavailableError(
                f"no {'/'.join(allowed)} device found; KDB_BACKEND={','.join(allowed)} hides {len(hidden)} "
                f"{kinds} device(s)", f"unset KDB_BACKEND or add {kinds} to it")
    return BackendUnavailableError(
        "no GPU and no OpenCL device found" + (f" (KDB_BACKEND allows only {', '.join(allowed)})"
                                              if len(allowed) < len(DISCOVERERS) else ""),
        "install the CPU device with `pip install 'kdbkit[opencl]'` (then scripts/ensure_cpu_opencl.sh "
        "in a checkout), or the GPU extras `kdbkit[cuda]` / `kdbkit[hip]` with their drivers")


def pick_device(index: int | DeviceInfo | None = None) -> DeviceInfo:
    """The device at ``index`` in :func:`discover_devices`' list (what ``--device`` takes), or the default one.

    A :class:`DeviceInfo` is taken as it is.

    Raises:
        BackendUnavailableError: there is no device at all, or none at that index.
        ProblemError: ``index`` is neither an integer (a bool is none) nor a DeviceInfo.
    """
    if index is None:
        return default_device()
    if isinstance(index, DeviceInfo):
        return index
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise ProblemError(f"device={index!r} is neither a device index nor a DeviceInfo",
                           "pass an index `kdb devices` lists, a DeviceInfo, or None for the default device")
    devices = discover_devices()
    if not 0 <= index < len(devices):
        raise BackendUnavailableError(f"no device {index}: {len(devices)} device(s) found",
                                      "list them with `kdb devices`")
    return devices[index]


def default_device(devices: list[DeviceInfo] | None = None) -> DeviceInfo:
    """The device to use when none is named: the first GPU, else the first OpenCL device.

    Args:
        devices: candidates in discovery order; :func:`discover_devices` by default.

    Raises:
        BackendUnavailableError: there is no device at all; the message says how to get one.
    """
    found = discover_devices() if devices is None else devices
    for machine_local in (False, True):  # a GPU's own API first; devices whose binaries stay local last
        for dev in found:
            if spec_for(dev.backend).machine_local is machine_local:
                return dev
    raise no_device_error()


def _backend_class(backend: str, what: str) -> type[Backend]:
    return spec_for(backend, what).load_backend_class()


def open_backend(device: DeviceInfo) -> Backend:
    """Open the backend that drives ``device``.

    Raises:
        BackendUnavailableError: the vendor library is missing or the device cannot be opened.
    """
    backend_class = _backend_class(device.backend, device.name)
    paths.import_platformdirs_in_background()  # while the device opens (see there)
    return backend_class(device)


def binary_format_of(backend: str) -> str:
    """The binary format a backend loads, as recorded in bundles (``cubin``, ``hsaco``, ``ocl-binary``).

    Raises:
        BackendUnavailableError: no such backend.
    """
    return spec_for(backend, "a binary format").binary_format
