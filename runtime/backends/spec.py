"""Backends described once: one :class:`BackendSpec` per backend, in discovery order.

A spec says everything the rest of kdbkit asks about a backend: the arch spelling it owns (from
:mod:`kdbkit.kdb.arch`), the binary format its bundles hold, where its discoverer, backend class
and compilers live (imported on first use: this module loads no vendor library and no backend
module), whether its binaries load only on the machine that built them, the remedy that installs
it, and the optional capabilities its backend class has. Discovery, ``KDB_BACKEND``, the doctor,
``kdb targets``, the builder and the handle read these specs; none names a backend itself.

Adding a backend is one spec here (its arch spelling in ``kdb/arch.py``) and its modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from kdbkit.kdb.arch import Spelling, spelling_of
from kdbkit.runtime.errors import BackendUnavailableError

if TYPE_CHECKING:
    from kdbkit.runtime.backends.base import Backend, DeviceInfo
    from kdbkit.runtime.compilers.base import Compiler

# Optional backend abilities, declared by a spec and its backend class, never found by hasattr.
CAPABILITIES = {
    "streams": "launches go to a stream the caller picks (Handle.set_stream; the backend's `stream`)",
    "occupancy": "an occupancy calculator: `resident_groups(kernel, block_threads, shared_bytes)`",
    "wrap": "wraps a foreign device pointer as a non-owning buffer: `wrap(ptr, nbytes)` (PyTorch, CuPy)",
    "param_blocks": "passes a struct by value as a launch argument (`ParamBlock`: a tensor map, say)",
    "tensor_maps": "encodes TMA tensor maps: `tensor_map(address, element_bytes, dims, strides, box)` and "
                   "`tensor_map_im2col(...)` (sm_90+)",
}


def _load(path: str) -> Any:
    """``package.module:name`` -> the object, importing the module now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BackendSpec:
    """One backend, as every other module sees it.

    Attributes:
        name: ``cuda``, ``hip``, ``opencl``.
        binary_format: what its bundles hold and its backend loads (``cubin``, ``hsaco``, ``ocl-binary``).
        discoverer: ``module:function`` listing its local devices (empty when its library is missing).
        backend_class: ``module:Class`` driving one of its devices.
        compilers: ``module:Class`` of its compilers, preferred first.
        machine_local: its binaries load only where they were built (PoCL's are native CPU code
            for one PoCL build): no offline build for another machine, bundles made on the device.
        install_remedy: what to install to use it, for messages.
        compiler_remedy: what to install to compile for it here.
        capabilities: names from :data:`CAPABILITIES` its backend class has.
    """

    name: str
    binary_format: str
    discoverer: str
    backend_class: str
    compilers: tuple[str, ...]
    machine_local: bool
    install_remedy: str
    compiler_remedy: str
    capabilities: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))
        unknown = sorted(self.capabilities - CAPABILITIES.keys())
        if unknown:
            raise ValueError(f"backend {self.name}: unknown capabilities {unknown} (known: {', '.join(CAPABILITIES)})")

    @property
    def arch_spelling(self) -> Spelling:
        """How its archs are spelt, with their ELF machine (``kdb/arch.py``)."""
        return spelling_of(self.name)

    def has(self, capability: str) -> bool:
        """Whether its backend class has ``capability`` (a name from :data:`CAPABILITIES`).

        Raises:
            ValueError: not a capability name (a typo would otherwise say no, silently).
        """
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown backend capability {capability!r}; known: {', '.join(CAPABILITIES)}")
        return capability in self.capabilities

    def discover(self) -> list["DeviceInfo"]:
        """Its local devices; empty when its vendor library is missing."""
        return _load(self.discoverer)()

    def load_backend_class(self) -> type["Backend"]:
        """Its backend class (the module imports no vendor library until a device is opened)."""
        return _load(self.backend_class)

    def compiler_classes(self) -> list[type["Compiler"]]:
        """Its compiler classes, preferred first."""
        return [_load(path) for path in self.compilers]


BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec(
        "cuda", "cubin",
        discoverer="kdbkit.runtime.backends.cuda:discover",
        backend_class="kdbkit.runtime.backends.cuda:CudaBackend",
        compilers=("kdbkit.runtime.compilers.nvrtc:NvrtcCompiler",),
        machine_local=False,
        install_remedy="install the CUDA extra (pip install 'kdbkit[cuda]') and an NVIDIA driver",
        compiler_remedy="pip install 'kdbkit[cuda]'",
        capabilities=frozenset({"streams", "occupancy", "wrap", "param_blocks", "tensor_maps"})),
    BackendSpec(
        "hip", "hsaco",
        discoverer="kdbkit.runtime.backends.hip:discover",
        backend_class="kdbkit.runtime.backends.hip:HipBackend",
        # hiprtc is ROCm's own and matches the runtime; a stock clang builds where ROCm is absent.
        compilers=("kdbkit.runtime.compilers.hiprtc:HiprtcCompiler",
                   "kdbkit.runtime.compilers.amdgcn_clang:AmdgcnClangCompiler"),
        machine_local=False,
        install_remedy="install ROCm and the HIP extra: pip install 'kdbkit[hip]'",
        compiler_remedy="install ROCm and pip install 'kdbkit[hip]', or `apt-get install clang-19 lld-19`"),
    BackendSpec(
        "opencl", "ocl-binary",
        discoverer="kdbkit.runtime.backends.opencl:discover",
        backend_class="kdbkit.runtime.backends.opencl:OpenCLBackend",
        compilers=("kdbkit.runtime.compilers.opencl:OpenCLCompiler",),
        machine_local=True,
        install_remedy="install the OpenCL extra: pip install 'kdbkit[opencl]'",
        compiler_remedy="install the OpenCL extra: pip install 'kdbkit[opencl]'"),
)
BACKEND_NAMES: tuple[str, ...] = tuple(spec.name for spec in BACKENDS)  # discovery order
_BY_NAME = {spec.name: spec for spec in BACKENDS}


def spec_for(backend: str, what: str = "") -> BackendSpec:
    """The spec of ``backend``.

    Args:
        backend: its name.
        what: what it was asked for (a device's name, "a binary format"), for the message.

    Raises:
        BackendUnavailableError: no such backend.
    """
    spec = _BY_NAME.get(backend)
    if spec is None:
        raise BackendUnavailableError(f"unknown backend {backend!r}" + (f" for {what}" if what else ""),
                                      f"use one of {', '.join(BACKEND_NAMES)}")
    return spec


def discoverers() -> dict[str, Callable[[], list["DeviceInfo"]]]:
    """Backend name -> its discoverer, in discovery order."""
    return {spec.name: spec.discover for spec in BACKENDS}
