"""Repeat calls skip the set-up: a primitive called again the same way launches at once.

A call's set-up (wrapping each tensor, validating descriptors, building the problem and its
config string, the choice and invoker look-ups) cost the host 100-200 µs per call on the lent
H100 machine's CPU, more than many kernels take. So a call whose every tensor is one of the
caller's device tensors, used in place, leaves a plan behind: the invoker it ran and which
argument fed each of the invoker's tensors. The plan is keyed by the call's other arguments
and each tensor argument's kind, shape, strides, type and device, so a later call with the
same key is the same problem: it takes the tensors' current addresses and calls the invoker.

Calls with NumPy arrays, outputs left for kdbkit to allocate, or temporaries never leave a
plan (they run the full path every time), and while KDB_CHECK_NUMERICS or
KDB_ENABLE_LOGGING_CMD is set every call takes the full path, so both see every call.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any, Callable

from kdbkit.runtime import env
from kdbkit.runtime.tensor import DeviceTensor

MAX_PLANS = 4096  # per handle; past it the plans start over (a program with endless shapes)
_recording: contextvars.ContextVar["_Recorder | None"] = contextvars.ContextVar("kdbkit_plan", default=None)


def _signature(value: Any) -> Any:
    """A hashable description of a device tensor argument (None stays None); ``...`` for
    anything that cannot take the fast path (NumPy arrays, CPU tensors, numbers...)."""
    if value is None:
        return None
    if isinstance(value, DeviceTensor):
        return ("kdbkit", value.desc)
    if type(value).__module__.startswith("torch") and hasattr(value, "data_ptr"):
        device = value.device
        return ("torch", value.dtype, value.shape, value.stride(), device) if device.type == "cuda" else ...
    face = getattr(value, "__cuda_array_interface__", None)
    if face is not None:
        return ("cai", face["typestr"], tuple(face["shape"]), face.get("strides"), getattr(value, "device", None))
    return ...


def _address(value: Any) -> int:
    if type(value).__module__.startswith("torch"):
        return value.data_ptr()
    return value.__cuda_array_interface__["data"][0]


class _Plan:
    __slots__ = ("invoker", "feeds", "result")

    def __init__(self, invoker, feeds, result):
        self.invoker, self.feeds, self.result = invoker, feeds, result


class _Recorder:
    """What one full-path call did, as far as a plan needs it."""

    def __init__(self, arguments: dict[str, Any]):
        self.arguments = arguments
        self.origins: dict[int, tuple[str, Any]] = {}  # id(buffer) -> (argument name, buffer)
        self.calls: list[tuple[Any, dict]] = []

    def note(self, buffer: Any, what: str, value: Any) -> None:
        """``buffer`` is argument ``what``'s device tensor, in place (not a copy, not a new tensor)."""
        if what in self.arguments and self.arguments[what] is value and _signature(value) is not ...:
            self.origins[id(buffer)] = (what, buffer)

    def plan(self, result: Any) -> _Plan | None:
        if len(self.calls) != 1:
            return None  # none, or several invokers: not a plan's shape
        invoker, buffers = self.calls[0]
        feeds = []
        for keyword, buffer in buffers.items():
            origin = self.origins.get(id(buffer))
            if origin is None or origin[1] is not buffer:
                return None  # a temporary, an allocated output, or a stand-in buffer
            feeds.append((keyword, origin[0], int(getattr(buffer, "nbytes", 0))))
        shape = _result_shape(result, self.arguments)
        return None if shape is ... else _Plan(invoker, tuple(feeds), shape)


def _result_shape(result: Any, arguments: dict[str, Any]) -> Any:
    """The call's return value as argument names (None kept), or ``...`` if it holds anything else."""
    def name_of(value):
        if value is None:
            return None
        for name, argument in arguments.items():
            if argument is value:
                return name
        return ...

    if isinstance(result, tuple):
        names = tuple(name_of(v) for v in result)
        return ... if ... in names else names
    return name_of(result)


def note_buffer(buffer: Any, what: str, value: Any) -> None:
    """Operands: ``buffer`` is ``value`` (argument ``what``) used in place."""
    recorder = _recording.get()
    if recorder is not None:
        recorder.note(buffer, what, value)


def note_invoke(invoker: Any, buffers: dict[str, Any]) -> None:
    """invoke: the invoker ran with these buffers."""
    recorder = _recording.get()
    if recorder is not None:
        recorder.calls.append((invoker, buffers))


def _full_path_only() -> bool:
    """Numerics checks or command logging asked for: each call goes the full way (read through
    runtime/env.py, the one parser of each variable). get_int, not numerics.flags(), which also
    builds a flag object on every call (0.8 against 1.2 µs here)."""
    return bool(env.get_int("KDB_CHECK_NUMERICS")) or env.get_bool("KDB_ENABLE_LOGGING_CMD")


def repeatable(api: str, tensors: tuple[str, ...]) -> Callable:
    """Give a primitive's API function the fast path for repeat calls.

    ``tensors`` names its tensor arguments; every other argument is part of the plan's key.
    """
    def wrap(function: Callable) -> Callable:
        parameters = list(inspect.signature(function).parameters.values())
        names = [p.name for p in parameters[1:]]  # after the handle
        defaults = {p.name: p.default for p in parameters[1:] if p.default is not inspect.Parameter.empty}
        others = [n for n in names if n not in tensors]
        known = set(names)

        @functools.wraps(function)
        def call(handle, *args, **kwargs):
            arguments = dict(defaults)
            arguments.update(zip(names, args))
            arguments.update(kwargs)
            if not known.issuperset(kwargs):  # the function itself says which argument is unknown
                return function(handle, *args, **kwargs)
            signatures = [_signature(arguments.get(t)) for t in tensors]
            if any(s is ... for s in signatures) or _full_path_only():
                return function(handle, *args, **kwargs)
            key = (api, *signatures, *(arguments.get(n) for n in others))
            plans = handle.plans
            try:
                plan = plans.get(key)
            except TypeError:  # an unhashable parameter (a list for a window, ...): no plan
                return function(handle, *args, **kwargs)
            if plan is not None:
                backend = handle.backend
                buffers = {}
                for keyword, name, nbytes in plan.feeds:
                    value = arguments[name]
                    buffers[keyword] = value.buffer if isinstance(value, DeviceTensor) else \
                        backend.wrap(_address(value), nbytes)
                plan.invoker(**buffers)
                shape = plan.result
                if isinstance(shape, tuple):
                    return tuple(None if n is None else arguments[n] for n in shape)
                return None if shape is None else arguments[shape]
            recorder = _Recorder(arguments)
            token = _recording.set(recorder)
            try:
                result = function(handle, *args, **kwargs)
            finally:
                _recording.reset(token)
            plan = recorder.plan(result)
            if plan is not None:
                if len(plans) >= MAX_PLANS:
                    plans.clear()
                plans[key] = plan
            return result

        return call

    return wrap
