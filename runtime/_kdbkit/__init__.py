"""kdbkit: precompiled GPU kernels per architecture in SQLite bundles, and a runtime that uses them.

This file is the ``kdbkit`` package itself (pyproject maps ``runtime/_kdbkit`` to it; the
bundle format, the runtime and the offline side are ``kdbkit.kdb``, ``kdbkit.runtime`` and
``kdbkit.packager``). Importing it loads nothing else: each name below is imported the first
time it is used, and no folder is created, no device probed, no logging configured.

Example::

    import numpy as np
    import kdbkit

    with kdbkit.Handle() as handle:                       # the first GPU, else PoCL on the CPU
        program = handle.program("activation.c", ["-DKDB_DTYPE=float"])
        be = handle.backend
        x = np.linspace(-1, 1, 1000, dtype=np.float32)
        dx, dy = be.to_device(x), be.alloc(x.nbytes)
        be.launch(program.function("relu_fwd"), (4, 1, 1), (256, 1, 1), [dx, dy, np.int32(x.size)])
        assert (be.to_host(dy, np.empty_like(x)) == np.maximum(x, 0)).all()

Every error kdbkit raises is a :class:`KdbError`; the classes below name each kind.
"""

from __future__ import annotations

import importlib

# kdbkit's own names -> the module that defines each; with the primitives' (found, not listed
# here: each primitive package's __all__), what `dir(kdbkit)`, `__all__` and the lazy lookup give.
_EXPORTS = {
    # the version
    "__version__": "kdbkit.kdb.version",
    # bundles
    "Bundle": "kdbkit.kdb.bundle", "BundleMetadata": "kdbkit.kdb.bundle", "open_bundle": "kdbkit.kdb.bundle",
    "write_bundle": "kdbkit.kdb.writer", "merge_bundles": "kdbkit.kdb.merge", "verify_bundle": "kdbkit.kdb.verify",
    "Target": "kdbkit.kdb.target",
    # devices and the runtime
    "Handle": "kdbkit.runtime.handle", "Program": "kdbkit.runtime.program", "ProgramRequest": "kdbkit.runtime.program_key",
    "program_key": "kdbkit.runtime.program_key", "KernelSearchPath": "kdbkit.runtime.kernel_sources",
    "discover_devices": "kdbkit.runtime.backends.registry", "default_device": "kdbkit.runtime.backends.registry",
    "open_backend": "kdbkit.runtime.backends.registry", "DeviceInfo": "kdbkit.runtime.backends.base",
    "compiler_for": "kdbkit.runtime.compilers", "LookupChain": "kdbkit.runtime.lookup", "Source": "kdbkit.runtime.lookup",
    # tensors (each primitive's API is found in its package: kdbkit.runtime.primitives.api_names)
    "DataType": "kdbkit.runtime.tensor", "TensorDesc": "kdbkit.runtime.tensor", "DeviceTensor": "kdbkit.runtime.tensor",
    "find_solutions": "kdbkit.runtime.find", "run_solution": "kdbkit.runtime.find", "Solution": "kdbkit.runtime.find",
    "parse_config": "kdbkit.runtime.problem",
    # errors: the bundle format's
    "KdbError": "kdbkit.kdb.errors", "BundleError": "kdbkit.kdb.errors", "BundleNotFoundError": "kdbkit.kdb.errors",
    "NotABundleError": "kdbkit.kdb.errors", "EmptyBundleError": "kdbkit.kdb.errors",
    "CorruptBundleError": "kdbkit.kdb.errors",
    "CorruptEntryError": "kdbkit.kdb.errors", "CodecError": "kdbkit.kdb.errors",
    "UnsupportedFormatError": "kdbkit.kdb.errors", "TargetMismatchError": "kdbkit.kdb.errors",
    "BundleNameError": "kdbkit.kdb.errors", "BundleBusyError": "kdbkit.kdb.errors",
    "BundleWriteError": "kdbkit.kdb.errors", "ReadOnlyBundleError": "kdbkit.kdb.errors",
    "SigningKeyError": "kdbkit.kdb.errors",
    # errors: the runtime's
    "OptionsError": "kdbkit.runtime.errors", "KernelSourceError": "kdbkit.runtime.errors",
    "BackendUnavailableError": "kdbkit.runtime.errors", "DeviceCallError": "kdbkit.runtime.errors",
    "CompilerUnavailableError": "kdbkit.runtime.errors", "CompileError": "kdbkit.runtime.errors",
    "TargetError": "kdbkit.packager.errors", "PackageError": "kdbkit.packager.errors",
    "BinaryLoadError": "kdbkit.runtime.errors", "LaunchError": "kdbkit.runtime.errors",
    "LaunchArgumentError": "kdbkit.runtime.errors", "TransferError": "kdbkit.runtime.errors",
    "JitDisabledError": "kdbkit.runtime.errors", "ProblemError": "kdbkit.runtime.errors",
    "HandleClosedError": "kdbkit.runtime.errors",
    "NoSolverError": "kdbkit.runtime.errors", "NumericsError": "kdbkit.runtime.errors",
    "ExportError": "kdbkit.runtime.errors",
}

def _primitive_api() -> dict[str, str]:
    from kdbkit.runtime.primitives import api_names

    return api_names()


def _primitive_module(name: str) -> str | None:
    from kdbkit.runtime.primitives import api_module

    return api_module(name)


def __getattr__(name: str):
    if name == "__all__":  # computed on first use: importing kdbkit loads nothing else
        value = sorted(set(_EXPORTS) | set(_primitive_api()))
    else:
        module = _EXPORTS.get(name) or (None if name.startswith("__") else _primitive_module(name))
        if module is None:
            raise AttributeError(f"module 'kdbkit' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_primitive_api()))
