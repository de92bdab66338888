"""hip-python, the binding kdbkit reaches ROCm through: loading it, calling it, and its release lines.

AMD asks users to match hip-python to their ROCm, so kdbkit supports every release line in
:data:`SUPPORTED_RANGE` and detects at run time the calls whose form changed between them
(hip-python 10 made ``hipGetDeviceProperties`` take only the device and return the
properties; 6.x and 7.x fill a ``hipDeviceProp_t`` passed in). Everything here is checked
against each line by the stand-in HIP runtime tests (``tests/runtime/backends/test_hip_standin.py``).

hip-python mirrors the C API: every call returns a tuple whose first element is the error
(``hipError_t`` or ``hiprtcResult``) and whose other elements are the outputs. ``import hip``
works without ROCm; the first *call* then raises a bare ``RuntimeError`` ("failed to dlopen
libamdhip64.so"), which :func:`hip_call` turns into kdbkit's backend-unavailable error.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime.backends.spec import spec_for
from kdbkit.runtime.errors import BackendUnavailableError, CompilerUnavailableError, DeviceCallError

# Keep in step with pyproject's hip extra and docs/reference.md's HIP entry ("What was run where").
SUPPORTED_RANGE = ">=6.2,<11"
INSTALL_REMEDY = spec_for("hip").install_remedy
_NO_ROCM_REMEDY = ("install ROCm, or point ROCM_PATH (hip-python 10) or LD_LIBRARY_PATH (6.x, 7.x) at its lib "
                   "folder")
_WRONG_LINE_REMEDY = f"install a hip-python release kdbkit supports ({SUPPORTED_RANGE}) that matches your ROCm"


def load_hip():
    """``hip.hip``, imported on first use: importing kdbkit must not load the HIP runtime.

    Raises:
        BackendUnavailableError: hip-python is not installed or cannot be imported.
    """
    try:
        from hip import hip
    except Exception as e:  # ImportError, or a broken binding
        raise BackendUnavailableError(f"hip-python is not available ({e})", INSTALL_REMEDY) from e
    return hip


def load_hiprtc():
    """``hip.hiprtc``, imported on first use.

    Raises:
        CompilerUnavailableError: hip-python is not installed or cannot be imported.
    """
    try:
        from hip import hiprtc
    except Exception as e:
        raise CompilerUnavailableError(f"hiprtc is not available ({e})", INSTALL_REMEDY) from e
    return hiprtc


def _code(err) -> int:
    return int(getattr(err, "value", err))


def check_result(result, call: str, error: type[KdbError] = DeviceCallError,
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


def hip_call(fn, *args, call: str, error: type[KdbError] = DeviceCallError,
             unavailable: type[KdbError] = BackendUnavailableError, **kwargs):
    """Call a hip-python function and check its result.

    Args:
        fn: the binding's function, e.g. ``hip.hipMalloc``.
        call: how to name it in errors, e.g. ``"hipMalloc"``.
        error: raised when the call returns an error code.
        unavailable: raised when the ROCm library itself cannot be loaded.

    Raises:
        ``unavailable``: the binding could not load libamdhip64 / libhiprtc (no ROCm).
        DeviceCallError: the binding refused the arguments (a hip-python release whose form
            of the call kdbkit does not know).
        ``error``: the call returned an error code.
    """
    try:
        result = fn(*args, **kwargs)
    except KdbError:
        raise
    except RuntimeError as e:
        if "dlopen" in str(e) or "cannot open shared object" in str(e):
            raise unavailable(f"hip-python cannot load ROCm for {call} ({e})", _NO_ROCM_REMEDY) from e
        raise error(f"{call} raised {type(e).__name__}: {e}", _WRONG_LINE_REMEDY) from e
    except Exception as e:  # TypeError/ValueError: the binding's form of the call changed
        raise DeviceCallError(f"{call} raised {type(e).__name__}: {e}", _WRONG_LINE_REMEDY) from e
    return check_result(result, call, error)


@lru_cache(maxsize=4)
def _properties_take_only_the_device(fn) -> bool:
    """hip-python 10 and later: ``hipGetDeviceProperties(deviceId) -> (err, props)``."""
    try:
        return len(inspect.signature(fn).parameters) == 1
    except (TypeError, ValueError):  # no signature: the docstring's first line says it
        return "prop" not in (fn.__doc__ or "").split("\n", 1)[0]


def device_properties(hip, ordinal: int):
    """``hipDeviceProp_t`` of device ``ordinal``, in the form this hip-python release takes.

    Raises:
        BackendUnavailableError: ROCm cannot be loaded.
        DeviceCallError: the call failed.
    """
    fn = hip.hipGetDeviceProperties
    if _properties_take_only_the_device(fn):
        return hip_call(fn, ordinal, call="hipGetDeviceProperties")
    props = hip.hipDeviceProp_t()
    hip_call(fn, props, ordinal, call="hipGetDeviceProperties")
    return props


def destroy_program(rtc, prog) -> None:
    """``hiprtcDestroyProgram``, which takes a pointer to the program handle and clears it.

    ``prog.createRef()`` is that pointer (hip-python's own examples pass it); passing ``prog``
    itself would make hiprtc free whatever the handle's first bytes point at.

    Raises:
        CompilerUnavailableError: hiprtc refused the handle.
    """
    hip_call(rtc.hiprtcDestroyProgram, prog.createRef(), call="hiprtcDestroyProgram",
             error=CompilerUnavailableError, unavailable=CompilerUnavailableError)


def binding_version() -> str | None:
    """``"hip-python 6.4.4.555.40 (HIP 6.4.43484-123eb5128)"``, or ``None`` when not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = f"hip-python {version('hip-python')}"
        except PackageNotFoundError:
            return None
        import hip

        hip_version = getattr(hip, "HIP_VERSION_NAME", None)
        return f"{text} (HIP {hip_version})" if hip_version else text
    except Exception:
        return None
