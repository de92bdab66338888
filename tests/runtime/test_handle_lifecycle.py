"""Making a handle for a named device, and using one after close(): kdbkit errors, not
AttributeError or a vendor library's TypeError."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.backends.registry import discover_devices
from kdbkit.runtime.errors import BackendUnavailableError, HandleClosedError, ProblemError
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.tensor import DeviceTensor

CLOSED = r"^the handle is closed; make a new one"


def test_a_device_index_or_a_device_info_picks_the_device(isolated, chain_device):
    """Handle(device=1) raised AttributeError; device=0 worked only because 0 is falsy."""
    devices = discover_devices()
    index = devices.index(chain_device)
    with Handle(device=index) as by_index:
        assert by_index.device == chain_device
    with Handle(device=chain_device) as by_info:
        assert by_info.device == chain_device


def test_a_device_index_out_of_range_says_how_many_there_are(isolated):
    count = len(discover_devices())
    for index in (count, count + 1, -1):
        with pytest.raises(BackendUnavailableError,
                           match=rf"^no device {index}: {count} device\(s\) found; list them with `kdb devices`$"):
            Handle(device=index)
    for wrong in ("0", True, 0.0):
        with pytest.raises(ProblemError, match=r"is neither a device index nor a DeviceInfo"):
            Handle(device=wrong)


def test_every_call_on_a_closed_handle_is_a_kdbkit_error(isolated, chain_device):
    """A primitive call or handle.program() after close() gave pyopencl's TypeError."""
    handle = Handle(device=chain_device)  # owns its backend: close() closes it
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    device_x = DeviceTensor.from_host(handle.backend, x)
    device_y = DeviceTensor.from_host(handle.backend, x)
    kdbkit.activation_forward(handle, device_x, "relu", y=device_y)  # leaves a repeat call's plan
    handle.close()
    with pytest.raises(HandleClosedError, match=CLOSED):
        kdbkit.activation_forward(handle, x, "relu")
    with pytest.raises(HandleClosedError, match=CLOSED):
        kdbkit.activation_forward(handle, device_x, "relu", y=device_y)  # the plan's fast path too
    with pytest.raises(HandleClosedError, match=CLOSED):
        handle.program("activation.c", ["-DKDB_DTYPE=float"])
    with pytest.raises(HandleClosedError, match=CLOSED):
        kdbkit.find_solutions(handle, kdbkit.parse_config(
            "activ,dir=fwd,mode=relu,type=fp32,shape=64,xs=1,ys=1,a=0,b=0,g=0"))
    solution = kdbkit.Solution(kdbkit.parse_config("activ,dir=fwd,mode=relu,type=fp32,shape=64,xs=1,ys=1,a=0,b=0,g=0"),
                               1, "ActivPacked", 0.0, 0, "user")
    with pytest.raises(HandleClosedError, match=CLOSED):  # not the cached invoker on a closed backend
        kdbkit.run_solution(handle, solution, x=device_x, y=device_y)
    handle.close()  # twice is fine


def test_a_closed_handle_on_a_shared_backend_refuses_too(make_handle, chain_backend):
    handle = make_handle()
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    kdbkit.activation_forward(handle, x, "relu")
    handle.close()
    with pytest.raises(HandleClosedError, match=CLOSED):
        kdbkit.activation_forward(handle, x, "relu")
    with pytest.raises(HandleClosedError, match=CLOSED):
        handle.program("activation.c", ["-DKDB_DTYPE=float"])
    assert not chain_backend.closed  # the backend's owner still uses it
    np.testing.assert_array_equal(kdbkit.activation_forward(make_handle(), x, "relu"), np.maximum(x, 0))
