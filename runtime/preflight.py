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

AMD code objects add a second rule, whichever compiler made them: ROCm's loader refuses a code
object version newer than its release knows (``CODE_OBJECT_RELEASES``: v5 needs ROCm 5.2, v6,
the version of the generic targets such as ``gfx9-generic``, needs 6.2). The HIP runtime's
version stands for the release: HIP ships in the same ROCm release as the loader and numbers
itself after it. Where the version comes from: a bundle's entries come from one build with one
compiler, so its first entry's ELF header (``e_ident[EI_ABIVERSION]``) speaks for it; an
installed bundle, and a bare one offered to ``kdb install``, is judged by it (the runtime's
search reads it only where a HIP runtime said its version). A wheel is judged from its manifest
alone, which names no version: ``kdb install`` takes a HIP wheel made for this kdbkit to hold the
one version kdbkit's builder stores, and once installed its bundle is judged by its bytes.

``KDB_DEVICE_RUNTIME`` (``"CUDA 12.4"``, ``"HIP 6.1"``) makes the devices' runtime what it says,
to check a package against another machine's driver from this one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kdbkit.kdb import Bundle, KdbError
from kdbkit.runtime import env
from kdbkit.runtime.backends.amdgpu_code_object import code_object_version

_VERSION = re.compile(r"^\s*(CUDA|HIP)\s+(\d+)\.(\d+)", re.IGNORECASE)
_COMPILER = {"cuda": re.compile(r"^nvrtc (\d+)\.(\d+)"), "hip": re.compile(r"^hiprtc (\d+)\.(\d+)")}
_NAMES = {"cuda": ("NVRTC", "CUDA", "the NVIDIA driver"), "hip": ("hiprtc", "HIP", "ROCm")}
# AMD code object version -> the first ROCm release whose loader takes it, read from ROCR-Runtime's
# sources at each release tag: ExecutableImpl::LoadCodeObject (loader/executable.cpp) answers
# "unsupported code object version" above a bound, and AmdHsaCode::GetCodeObjectVersion
# (libamdhsacode/amd_hsa_code.cpp) fails on an EI_ABIVERSION it does not list. The bound was 3 up to
# ROCm 4.0 and 4 from 4.1 (commit 3a08d096, "Implement Target ID Proposal"); v5 came in 5.2 (9265409f,
# "Add code object v5 support"; 5.1's bound is 4), v6 with the generic targets in 6.2 (a93c18dc,
# "[libamdhsacode] Support COV6/Generic Targets"; 6.1's bound is 5). The lower end is 1 in every
# release read, so no release refuses an older version; v3 and older, and versions not listed here
# (a v7 to come), are not judged. Generic targets exist only as v6 (LLVM's AMDGPUUsage; llc refuses
# gfx9-generic with --amdhsa-code-object-version=5), so the v6 row covers them.
CODE_OBJECT_RELEASES = {4: (4, 1), 5: (5, 2), 6: (6, 2)}


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


def refusal(compiler: str, runtime: DeviceRuntime | None, *, code_objects: int | None = None) -> str:
    """Why binaries made by ``compiler`` will not load under ``runtime``; "" when they will or it cannot be told.

    Args:
        compiler: the bundle's or package's compiler identity (``nvrtc 13.0``, ``hiprtc 6.2``).
        runtime: the device's; None or a version it did not say: nothing is refused.
        code_objects: the AMD code object version of its binaries, where known (see
            :func:`code_object_refusal`).
    """
    if runtime is None or runtime.version is None:
        return ""
    return _compiler_refusal(compiler, runtime) or code_object_refusal(code_objects, runtime)


def code_object_refusal(version: int | None, runtime: DeviceRuntime | None) -> str:
    """Why AMD code objects of ``version`` will not load under a HIP ``runtime``; "" when they will
    or it cannot be told (another backend, an unknown runtime or version)."""
    if version is None or runtime is None or runtime.backend != "hip" or runtime.version is None:
        return ""
    needed = CODE_OBJECT_RELEASES.get(version)
    if needed is None or runtime.version >= needed:
        return ""
    older = [v for v, release in CODE_OBJECT_RELEASES.items() if runtime.version >= release]
    instead = f", or install a package of code object v{max(older)} or older" if older else ""
    release = f"ROCm {needed[0]}.{needed[1]}"
    return (f"holds AMD code object v{version}, which needs {release} or newer to load; this one supports "
            f"{runtime}: update ROCm to {needed[0]}.{needed[1]} or newer{instead}")


def bundle_refusal(bundle: Bundle, runtime: DeviceRuntime | None) -> str:
    """:func:`refusal` for an open bundle: its compiler, and for AMD binaries the code object
    version its first entry declares (read only when ``runtime`` is a HIP one that said its version)."""
    if runtime is None or runtime.version is None:
        return ""
    why = _compiler_refusal(bundle.metadata.compiler, runtime)
    if not why and runtime.backend == "hip":
        why = code_object_refusal(bundle_code_object_version(bundle), runtime)
    return why


def bundle_code_object_version(bundle: Bundle) -> int | None:
    """The AMD code object version of ``bundle``'s binaries, from its first entry's ELF header;
    None for other binaries, an empty bundle, or an entry that does not read (its load says why)."""
    if bundle.metadata.binary_format != "hsaco":
        return None
    try:
        first = bundle.first_entry()
        return None if first is None else code_object_version(first[2], what=f"{bundle.path}: {first[0]}")
    except KdbError:  # a damaged entry or not a code object: not judged here, the load refuses it with why
        return None


def _compiler_refusal(compiler: str, runtime: DeviceRuntime) -> str:
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
