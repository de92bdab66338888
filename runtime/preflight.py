"""Whether a bundle's binaries will load on this machine's driver, said before anything runs.

A bundle's target says which devices its binaries are for; whether the driver can load them is
the compiler's business. A cubin made by NVRTC of CUDA ``A.B`` loads on a driver for CUDA ``A.x``
or newer (CUDA's minor-version compatibility) and on no older major: the load would fail at
run time with an error that names neither the bundle nor the fix. HIP's runtime and hiprtc follow
the same rule by major version. OpenCL binaries are tied to the driver that made them, which the
target already names (an ``ocl-<hash>`` arch digests the platform and driver strings), so the
arch check covers them. What cannot be judged (an unknown compiler, a driver that did not say its
version) is not refused: the load itself is the last check, and a binary that does not load is a
miss with one warning, never a crash.

``KDB_DEVICE_RUNTIME`` (``"CUDA 12.4"``) makes the devices' runtime what it says, to check a
package against another machine's driver from this one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kdbkit.runtime import env

_VERSION = re.compile(r"^\s*(CUDA|HIP)\s+(\d+)\.(\d+)", re.IGNORECASE)
_COMPILER = {"cuda": re.compile(r"^nvrtc (\d+)\.(\d+)"), "hip": re.compile(r"^hiprtc (\d+)\.(\d+)")}
_NAMES = {"cuda": ("NVRTC", "CUDA", "the NVIDIA driver"), "hip": ("hiprtc", "HIP", "ROCm")}


class DeviceRuntime(NamedTuple):
    """What a device's driver loads: its backend and the runtime version it supports (None: unknown)."""

    backend: str
    version: tuple[int, int] | None

    def __str__(self) -> str:
        name = _NAMES.get(self.backend, ("", self.backend, ""))[1]
        return f"{name} {self.version[0]}.{self.version[1]}" if self.version else f"{name} (version unknown)"


def parse_runtime(backend: str, text: str) -> DeviceRuntime:
    """``DeviceRuntime`` from a device's runtime text (``"CUDA 13.0"``); version None when it says none."""
    m = _VERSION.match(text or "")
    return DeviceRuntime(backend, (int(m.group(2)), int(m.group(3))) if m else None)


def runtime_of(backend: str, text: str) -> DeviceRuntime:
    """The device's runtime, or ``KDB_DEVICE_RUNTIME``'s where it names this backend's."""
    override = env.get_str("KDB_DEVICE_RUNTIME")
    if override:
        forced = parse_runtime(backend, override)
        if forced.version is not None and override.strip().upper().startswith(_NAMES.get(backend, ("", "?"))[1]):
            return forced
    return parse_runtime(backend, text)


def refusal(compiler: str, runtime: DeviceRuntime | None) -> str:
    """Why binaries made by ``compiler`` will not load under ``runtime``; "" when they will or it cannot be told."""
    if runtime is None or runtime.version is None:
        return ""
    pattern = _COMPILER.get(runtime.backend)
    m = pattern.match(compiler or "") if pattern else None
    if m is None:
        return ""
    built = (int(m.group(1)), int(m.group(2)))
    if runtime.version[0] >= built[0]:
        return ""
    tool, name, driver = _NAMES[runtime.backend]
    return (f"built with {tool} {built[0]}.{built[1]}, whose binaries need a driver for {name} {built[0]}.0 or "
            f"newer; this one supports {runtime}: update {driver}, or install a package built with "
            f"{tool} {runtime.version[0]}.x")
