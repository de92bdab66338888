"""GPU backends (CUDA, HIP, OpenCL) behind one interface, and the discovery of local devices.

Public API::

    discover_devices() -> list[DeviceInfo]   CUDA, then HIP, then OpenCL; env overrides applied
    default_device() -> DeviceInfo           first GPU, else first OpenCL device
    open_backend(device) -> Backend          load / launch / memory / timing / close
    spec_for(name) -> BackendSpec            what a backend is: arch spelling, binary format,
                                             classes, compilers, machine-local, capabilities

Compiling is not a backend's job: see ``kdbkit.runtime.compilers``. Importing this package
loads no vendor library and probes no device: each vendor module imports its library inside
the functions that need it.
"""

from kdbkit.runtime.backends.base import Backend, Buffer, DeviceInfo, Kernel, Module
from kdbkit.runtime.backends.registry import default_device, discover_devices, open_backend
from kdbkit.runtime.backends.spec import BACKENDS, BackendSpec, spec_for

__all__ = ["BACKENDS", "Backend", "BackendSpec", "Buffer", "DeviceInfo", "Kernel", "Module", "default_device",
           "discover_devices", "open_backend", "spec_for"]
