"""Repeat calls skip the set-up: a primitive called again the same way launches at once.

A call's set-up (wrapping each tensor, validating descriptors, building the problem and its
config string, the choice and invoker look-ups) costs the host more per call than many kernels
take on the device. So a call whose every tensor is one of the
caller's device tensors, used in place, leaves a plan behind: the invoker it ran and which
argument fed each of the invoker's tensors. The plan is keyed by the call's other arguments
and each tensor argument's kind, shape, strides, type and device, so a later call with the
same key is the same problem: it takes the tensors' current addresses and calls the invoker.

An output left for kdbkit to allocate beside PyTorch or CuPy inputs is part of the plan too: a
repeat call allocates it anew the same way (torch.empty_like's cost, a few µs, instead of the
full path's). Calls with NumPy arrays, kdbkit's own new outputs (DeviceTensor.empty is a
device allocation) or temporaries never leave a plan (they run the full path every time), and
while KDB_CHECK_NUMERICS or KDB_ENABLE_LOGGING_CMD is set every call takes the full path, so
both see every call.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any, Callable

from kdbkit.runtime import env, interop
from kdbkit.runtime.tensor import DeviceTensor

MAX_PLANS = 4096  # per handle (its dispatcher keeps them); past it the plans start over (a program with endless shapes)
_recording: contextvars.ContextVar["_Recorder | None"] = contextvars.ContextVar("kdbkit_plan", default=None)


# A tensor argument's kind, found once per Python type: how to describe it and find its address.
_KDBKIT, _TORCH, _CAI, _NONE, _OTHER = range(5)
_kinds: dict[type, int] = {type(None): _NONE}


def _kind_of(kind_type: type) -> int:
    kind = _kinds.get(kind_type)
    if kind is None:
        if issubclass(kind_type, DeviceTensor):
            kind = _KDBKIT
        elif kind_type.__module__.startswith("torch") and hasattr(kind_type, "data_ptr"):
            kind = _TORCH
        elif hasattr(kind_type, "__cuda_array_interface__"):
            kind = _CAI
        else:
            kind = _OTHER
        _kinds[kind_type] = kind
    return kind


def _signature(value: Any) -> Any:
    """A hashable description of a device tensor argument (None stays None); ``...`` for
    anything that cannot take the fast path (NumPy arrays, CPU tensors, numbers...)."""
    kind = _kind_of(type(value))
    if kind == _TORCH:
        # get_device(), not .device, which builds a torch.device on every call
        return (value.dtype, value.shape, value.stride(), value.get_device()) if value.is_cuda else ...
    if kind == _KDBKIT:
        return value.desc.key
    if kind == _NONE:
        return None
    if kind == _CAI:
        face = value.__cuda_array_interface__
        return ("cai", face["typestr"], tuple(face["shape"]), face.get("strides"), getattr(value, "device", None))
    return ...


def _address(value: Any) -> int:
    if _kinds[type(value)] == _TORCH:
        return value.data_ptr()
    return value.__cuda_array_interface__["data"][0]


class _Plan:
    __slots__ = ("invoker", "feeds", "result", "wrapped", "new")

    def __init__(self, invoker, feeds, result, new=()):
        # feeds: (invoker keyword, argument slot or ("new", k), bytes); result: the same, per
        # returned value; new: per output kdbkit allocates, (slot of the tensor it is made
        # beside, its descriptor).
        self.invoker, self.feeds, self.result, self.new = invoker, feeds, result, new
        # Per feed, the buffer that wrapped its tensor last time: reused while the address is
        # the same (the usual case: a model's tensors stay put), instead of a new wrap per call.
        self.wrapped = [None] * len(feeds)


class _Recorder:
    """What one full-path call did, as far as a plan needs it."""

    def __init__(self, arguments: dict[str, Any]):
        self.arguments = arguments
        self.origins: dict[int, tuple[Any, Any]] = {}  # id(buffer) -> (argument name or ("new", k), buffer)
        self.calls: list[tuple[Any, dict]] = []
        self.new: list[tuple[Any, Any, Any]] = []  # (output kdbkit allocated, the tensor it is beside, descriptor)

    def note(self, buffer: Any, what: str, value: Any) -> None:
        """``buffer`` is argument ``what``'s device tensor, in place (not a copy), or an output
        noted by :meth:`note_new`."""
        if what in self.arguments and self.arguments[what] is value and _signature(value) is not ...:
            self.origins[id(buffer)] = (what, buffer)
            return
        for k, (new, _, _) in enumerate(self.new):
            if new is value:
                self.origins[id(buffer)] = (("new", k), buffer)

    def note_new(self, value: Any, beside: Any, desc: Any) -> None:
        self.new.append((value, beside, desc))

    def _slot_of(self, origin: Any, slots: dict[str, int]) -> Any:
        return origin if isinstance(origin, tuple) else slots[origin]

    def plan(self, result: Any, slots: dict[str, int]) -> _Plan | None:
        """The plan, with each tensor and the result given as argument positions (``slots``)."""
        if len(self.calls) != 1:
            return None  # none, or several invokers: not a plan's shape
        invoker, buffers = self.calls[0]
        new = []
        for _, beside, desc in self.new:
            name = next((n for n, argument in self.arguments.items() if argument is beside), None)
            if name is None or _signature(beside) is ...:
                return None  # made beside something that is not a device tensor argument
            new.append((slots[name], desc))
        feeds = []
        for keyword, buffer in buffers.items():
            origin = self.origins.get(id(buffer))
            if origin is None or origin[1] is not buffer:
                return None  # a temporary, a kdbkit-allocated buffer, or a stand-in buffer
            feeds.append((keyword, self._slot_of(origin[0], slots), int(getattr(buffer, "nbytes", 0))))
        shape = _result_shape(result, self.arguments, [v for v, _, _ in self.new])
        if shape is ...:
            return None
        shape = [None if n is None else self._slot_of(n, slots) for n in shape] if isinstance(shape, list) \
            else None if shape is None else self._slot_of(shape, slots)
        return _Plan(invoker, tuple(feeds), shape, tuple(new))


def _result_shape(result: Any, arguments: dict[str, Any], new: list) -> Any:
    """The call's return value as argument names or ("new", k) (None kept; a tuple as a list),
    or ``...`` if it holds anything else."""
    def name_of(value):
        if value is None:
            return None
        for name, argument in arguments.items():
            if argument is value:
                return name
        for k, made in enumerate(new):
            if made is value:
                return ("new", k)
        return ...

    if isinstance(result, tuple):
        names = [name_of(v) for v in result]
        return ... if any(n is ... for n in names) else names
    return name_of(result)


def note_buffer(buffer: Any, what: str, value: Any) -> None:
    """Operands: ``buffer`` is ``value`` (argument ``what``) used in place."""
    recorder = _recording.get()
    if recorder is not None:
        recorder.note(buffer, what, value)


def note_new(value: Any, beside: Any, desc: Any) -> None:
    """device_default: ``value`` is an output kdbkit allocated like ``beside``, shaped ``desc``."""
    recorder = _recording.get()
    if recorder is not None:
        recorder.note_new(value, beside, desc)


def note_invoke(invoker: Any, buffers: dict[str, Any]) -> None:
    """invoke: the invoker ran with these buffers."""
    recorder = _recording.get()
    if recorder is not None:
        recorder.calls.append((invoker, buffers))


def full_path_only() -> bool:
    """Numerics checks or command logging asked for: each call goes the full way (read through
    runtime/env.py, the one parser of each variable). get_int, not numerics.flags(), which also
    builds a flag object each time: this check runs on every call of every primitive."""
    if not env.any_set("KDB_CHECK_NUMERICS", "KDB_ENABLE_LOGGING_CMD"):  # the usual case, unparsed
        return False
    return bool(env.get_int("KDB_CHECK_NUMERICS")) or env.get_bool("KDB_ENABLE_LOGGING_CMD")


def repeatable(api: str, tensors: tuple[str, ...]) -> Callable:
    """Give a primitive's API function the fast path for repeat calls.

    ``tensors`` names its tensor arguments; every other argument is part of the plan's key.
    """
    def wrap(function: Callable) -> Callable:
        parameters = list(inspect.signature(function).parameters.values())
        names = [p.name for p in parameters[1:]]  # after the handle
        defaults = {p.name: p.default for p in parameters[1:] if p.default is not inspect.Parameter.empty}
        positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters[1:])
        slots = {name: i for i, name in enumerate(names)}
        tensor_slots = [slots[t] for t in tensors if t in slots]  # outputs it only returns are not arguments
        other_slots = [i for i, name in enumerate(names) if name not in tensors]
        # Per count of positional arguments: the keywords a call may add (a name also given by
        # position, or an unknown one, goes the full way, where the function itself says so),
        # and the defaults of the rest.
        keywords = [frozenset(names[n:]) for n in range(len(names) + 1)]
        missing = object()
        rest = [[defaults.get(name, missing) for name in names[n:]] for n in range(len(names) + 1)]

        @functools.wraps(function)
        def call(handle, *args, **kwargs):
            count = len(args)
            if count > positional or (kwargs and not keywords[count].issuperset(kwargs)):
                return function(handle, *args, **kwargs)
            values = [*args, *rest[count]]
            for name, value in kwargs.items():  # only those given: most of a primitive's keywords are not
                values[slots[name]] = value
            signatures = [_signature(values[i]) for i in tensor_slots]
            # identity, not ``in``: that would call each descriptor's __eq__ against the Ellipsis
            if any(s is ... for s in signatures) or full_path_only():
                return function(handle, *args, **kwargs)
            key = (api, *signatures, *[values[i] for i in other_slots])
            plans = handle.dispatcher.plans
            try:
                plan = plans.get(key)
            except TypeError:  # an unhashable parameter (a list for a window, ...): no plan
                return function(handle, *args, **kwargs)
            if plan is not None:
                buffers, wrapped = {}, plan.wrapped
                made = [interop.empty_like(values[slot], desc) for slot, desc in plan.new] if plan.new else None
                for k, (keyword, slot, nbytes) in enumerate(plan.feeds):
                    value = values[slot] if type(slot) is int else made[slot[1]]
                    if _kinds[type(value)] == _KDBKIT:
                        buffers[keyword] = value.buffer
                        continue
                    address, held = _address(value), wrapped[k]
                    if held is None or held.ptr != address:
                        held = wrapped[k] = handle.backend.wrap(address, nbytes)
                    buffers[keyword] = held
                plan.invoker(**buffers)
                shape = plan.result
                if type(shape) is list:
                    return tuple(None if n is None else values[n] if type(n) is int else made[n[1]] for n in shape)
                return None if shape is None else values[shape] if type(shape) is int else made[shape[1]]
            if any(v is missing for v in values):  # a required argument is absent: the function says which
                return function(handle, *args, **kwargs)
            arguments = dict(zip(names, values))
            recorder = _Recorder(arguments)
            token = _recording.set(recorder)
            try:
                result = function(handle, *args, **kwargs)
            finally:
                _recording.reset(token)
            plan = recorder.plan(result, slots)
            if plan is not None:
                if len(plans) >= MAX_PLANS:
                    plans.clear()
                plans[key] = plan
            return result

        return call

    return wrap
