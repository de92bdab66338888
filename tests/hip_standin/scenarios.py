"""What a child process does under the stand-in HIP runtime: ``python scenarios.py <name>``.

The child runs with one hip-python release line first on ``sys.path`` and the stand-in
libraries on the loader's path (the parent, ``tests/runtime/backends/test_hip_standin.py``, sets
both), drives kdbkit's real HIP code through the real binding, and prints one line
``KDB-RESULT <json>`` with what it saw. The stand-in's own call log is read by the parent.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e), "problem": getattr(e, "problem", None),
            "remedy": getattr(e, "remedy", None), "log": getattr(e, "log", None)}


def _live(what: str) -> int:
    lib = ctypes.CDLL(os.path.join(os.environ["KDB_STANDIN_LIB"], "libamdhip64.so"))
    lib.kdb_standin_live.restype = ctypes.c_long
    return int(lib.kdb_standin_live(what.encode()))


def _live_programs() -> int:
    lib = ctypes.CDLL(os.path.join(os.environ["KDB_STANDIN_LIB"], "libhiprtc.so"))
    lib.kdb_standin_live_programs.restype = ctypes.c_long
    return int(lib.kdb_standin_live_programs())


def _buffer_address(data: bytes) -> int:
    return int(np.frombuffer(data, np.uint8).ctypes.data)


def discover() -> dict:
    from hip import hip

    from kdbkit.runtime.backends import hip as hip_backend
    from kdbkit.runtime.backends.hip_binding import binding_version

    props = hip.hipDeviceProp_t()
    return {
        "devices": [
            {"index": d.index, "name": d.name, "target": d.target.full_arch, "cu": d.target.cu,
             "memory": d.memory_bytes, "driver": d.driver, "runtime": d.runtime}
            for d in hip_backend.discover()
        ],
        "props_bytes": props.c_sizeof(),
        "binding": binding_version(),
    }


def no_rocm() -> dict:
    """hip-python installed, ROCm not: no devices, and opening one says what is missing."""
    from kdbkit.kdb.target import Target
    from kdbkit.runtime.backends import hip as hip_backend
    from kdbkit.runtime.backends.base import DeviceInfo
    from kdbkit.runtime.compilers.hiprtc import hiprtc_identity

    out: dict = {"devices": hip_backend.discover()}
    try:
        hip_backend.HipBackend(DeviceInfo("hip", 0, "MI300X", Target("hip", "gfx942", (), 304), 1 << 30))
    except Exception as e:
        out["backend"] = _error(e)
    try:
        hiprtc_identity()
    except Exception as e:
        out["hiprtc"] = _error(e)
    return out


def _offline_code_object(target: str) -> bytes:
    from kdbkit.runtime.compilers.amdgcn_clang import compile_amdgcn
    from kdbkit.runtime.kernel_sources import KernelSearchPath

    return compile_amdgcn(KernelSearchPath().read("activation.c").text(), target, name="activation.c")


def backend() -> dict:
    """Load, launch, copy, time and close on device 0, as the chain would."""
    from kdbkit.runtime.backends import hip as hip_backend

    out: dict = {}
    device = hip_backend.discover()[0]
    be = hip_backend.HipBackend(device)
    code = _offline_code_object(be.hardware_target.full_arch)
    module = be.load(code)
    out["module_image_address"] = _buffer_address(module.image)
    out["module_image_is_loaded_bytes"] = module.image is code
    kernel = module.function("leaky_relu_fwd")
    x = np.arange(1000, dtype=np.float32) - 500
    xb = be.to_device(x)
    yb = be.alloc(x.nbytes)
    out["x_ptr"], out["y_ptr"] = int(xb.ptr), int(yb.ptr)
    be.launch(kernel, (4, 1, 1), (256, 1, 1), [xb, yb, np.int32(x.size), np.float32(0.5)])
    back = be.to_host(xb, np.empty_like(x))
    out["round_trip_equal"] = bool(np.array_equal(back, x))
    out["time_ms"] = be.time_ms(lambda: be.launch(kernel, (1, 1, 1), (64, 1, 1),
                                                  [xb, yb, np.int32(1), np.float32(2.0)]), repeat=2)
    try:
        be.launch(kernel, (1, 1, 1), (64, 1, 1), [xb, yb, np.int32(1), np.longdouble(2.0)])
    except Exception as e:
        out["long_double"] = _error(e)
    mistakes = {
        "missing_argument": [xb, yb, np.int32(1)],
        "wrong_width": [xb, yb, np.int64(1), np.float32(2.0)],
        "buffer_for_value": [xb, yb, yb, np.float32(2.0)],
        "value_for_pointer": [xb, np.int64(0), np.int32(1), np.float32(2.0)],
    }
    for name, args in mistakes.items():
        try:
            be.launch(kernel, (1, 1, 1), (64, 1, 1), args)
        except Exception as e:
            out[name] = _error(e)
    try:
        module.function("no_such_kernel")
    except Exception as e:
        out["missing_kernel"] = _error(e)
    try:
        be.load(_offline_code_object("gfx90a"))
    except Exception as e:
        out["wrong_arch"] = _error(e)
    out["live_before_close"] = {w: _live(w) for w in ("allocations", "modules", "events")}
    xb.free()
    be.close()
    out["live_after_close"] = {w: _live(w) for w in ("allocations", "modules", "events")}
    try:
        be.alloc(4)
    except Exception as e:
        out["after_close"] = _error(e)
    return out


def module_lifetime() -> dict:
    """A module nobody holds is unloaded when collected, and its image lives until then."""
    import gc

    from kdbkit.runtime.backends import hip as hip_backend

    be = hip_backend.HipBackend(hip_backend.discover()[0])
    module = be.load(_offline_code_object(be.hardware_target.full_arch))
    kernel = module.function("relu_fwd")
    del module
    gc.collect()
    out = {"modules_while_kernel_held": _live("modules")}
    del kernel
    gc.collect()
    out["modules_after_release"] = _live("modules")
    be.close()
    return out


def failures() -> dict:
    """Each failing HIP call surfaces as kdbkit's error for it (the stand-in fails on request)."""
    from kdbkit.runtime.backends import hip as hip_backend

    be = hip_backend.HipBackend(hip_backend.discover()[0])
    code = _offline_code_object(be.hardware_target.full_arch)
    module = be.load(code)
    kernel = module.function("relu_fwd")
    buf = be.alloc(16)
    attempts = {
        "hipMalloc": lambda: be.alloc(64),
        "hipModuleLoadData": lambda: be.load(code),
        "hipModuleLaunchKernel": lambda: be.launch(kernel, (1, 1, 1), (64, 1, 1), [buf, buf, np.int32(4)]),
        "hipMemcpy": lambda: be.to_device(np.ones(4, np.float32)),
    }
    out = {}
    for call, attempt in attempts.items():
        os.environ["KDB_STANDIN_FAIL"] = call
        try:
            attempt()
            out[call] = None
        except Exception as e:
            out[call] = _error(e)
        finally:
            del os.environ["KDB_STANDIN_FAIL"]
    be.close()
    return out


def hiprtc() -> dict:
    """Compile with kdbkit's hiprtc compiler: identity, code, errors, nothing leaked."""
    from hip import hiprtc as rtc

    from kdbkit.kdb.target import Target
    from kdbkit.runtime.backends.elf_notes import amdgpu_target
    from kdbkit.runtime.compilers.hiprtc import HiprtcCompiler, hiprtc_identity
    from kdbkit.runtime.kernel_sources import KernelSearchPath
    from kdbkit.runtime.program_key import ProgramRequest

    out: dict = {"identity": hiprtc_identity()}
    compiler = HiprtcCompiler()
    source = KernelSearchPath().read("activation.c")
    code = compiler.compile(ProgramRequest("activation.c", ("-DKDB_DTYPE=float",)),
                            Target.parse("gfx90a:xnack-"), source)
    out["target"] = list(amdgpu_target(code))
    out["live_programs_after_compile"] = _live_programs()
    with tempfile.TemporaryDirectory() as folder:  # a user kernel; kdb_compat.h comes from kdbkit's own
        Path(folder, "broken.c").write_text('#include "kdb_compat.h"\n'
                                            'KDB_KERNEL void broken(float* x) { x[0] = not_declared; }\n')
        try:
            compiler.compile(ProgramRequest("broken.c", ()), Target.parse("gfx942"),
                             KernelSearchPath([folder]).read("broken.c"))
        except Exception as e:
            out["broken"] = _error(e)
    out["live_programs_after_error"] = _live_programs()
    # The defect the stand-in exists to catch: the handle itself, not its address.
    prog = rtc.hiprtcCreateProgram(b"", b"raw.c", 0, [], [])[1]
    out["destroy_handle_itself"] = int(getattr(rtc.hiprtcDestroyProgram(prog)[0], "value", -1))
    out["destroy_reference"] = int(getattr(rtc.hiprtcDestroyProgram(prog.createRef())[0], "value", -1))
    out["live_programs_at_end"] = _live_programs()
    return out


def handle() -> dict:
    """The whole chain on the HIP path: JIT through hiprtc into the user cache, then launch."""
    import kdbkit

    out: dict = {}
    with kdbkit.Handle() as h:
        program = h.program("activation.c", "-DKDB_DTYPE=float")
        out["device"] = h.device.name
        out["compiler"] = h.compiler.identity()
        out["source"] = program.source
        kernel = program.function("relu_fwd")
        x = h.backend.to_device(np.ones(8, np.float32))
        h.backend.launch(kernel, (1, 1, 1), (64, 1, 1), [x, x, np.int32(8)])
        x.free()
    return out


SCENARIOS = {f.__name__: f for f in (discover, no_rocm, backend, module_lifetime, failures, hiprtc, handle)}

if __name__ == "__main__":
    try:
        result = SCENARIOS[sys.argv[1]]()
    except Exception as e:  # the parent shows what failed
        result = {"scenario_error": _error(e)}
    print("KDB-RESULT " + json.dumps(result), flush=True)
