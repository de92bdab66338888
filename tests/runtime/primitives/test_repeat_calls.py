"""Repeat calls on device tensors skip the set-up (runtime/primitives/repeat.py), and stay right."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.logging_setup import configure_logging
from kdbkit.runtime.primitives import invoke as invoke_module
from kdbkit.runtime.reference import activation as activ_ref
from kdbkit.runtime.reference import layernorm as ln_ref
from kdbkit.runtime.reference import softmax as sm_ref
from kdbkit.runtime.primitives.activation.problem import ActivationMode
from kdbkit.runtime.tensor import DeviceTensor, TensorDesc

RELU, LEAKY = int(ActivationMode.parse("relu")), int(ActivationMode.parse("leakyrelu"))


def _device(handle, array):
    return DeviceTensor.from_host(handle.backend, np.ascontiguousarray(array, np.float32))


def _empty(handle, shape):
    return DeviceTensor.empty(handle.backend, TensorDesc.packed("fp32", shape))


@pytest.fixture
def full_path_calls(monkeypatch):
    """How many calls went the full way (through invoke)."""
    seen = []
    real = invoke_module.invoke

    def counting(*args, **kwargs):
        seen.append(args[1].config())
        return real(*args, **kwargs)

    for module in ("activation", "softmax", "layernorm", "batchnorm"):
        monkeypatch.setattr(f"kdbkit.runtime.primitives.{module}.api.invoke", counting)
    return seen


def test_a_repeat_call_runs_its_plan_on_the_new_tensors(handle, full_path_calls):
    rng = np.random.default_rng(1)
    for round_ in range(3):  # new buffers every time: the plan must take their addresses
        host = rng.standard_normal((6, 40)).astype(np.float32)
        x, y = _device(handle, host), _empty(handle, (6, 40))
        assert kdbkit.activation_forward(handle, x, "relu", y=y) is y
        np.testing.assert_allclose(y.to_host(handle.backend), activ_ref.forward(host, RELU))
        out = kdbkit.softmax_forward(handle, x, y=y)
        assert out is y
        np.testing.assert_allclose(y.to_host(handle.backend), sm_ref.forward(host), rtol=1e-5, atol=1e-6)
    assert len(full_path_calls) == 2  # the first round only
    assert len(handle.dispatcher.plans) == 2


def test_other_shapes_parameters_or_kinds_take_the_full_path(handle, full_path_calls):
    rng = np.random.default_rng(2)
    x, y = _device(handle, rng.standard_normal((4, 8))), _empty(handle, (4, 8))
    kdbkit.activation_forward(handle, x, "relu", y=y)
    kdbkit.activation_forward(handle, x, "leakyrelu", alpha=0.5, y=y)  # another mode
    kdbkit.activation_forward(handle, x, "leakyrelu", alpha=0.25, y=y)  # another parameter
    x2, y2 = _device(handle, rng.standard_normal((8, 4))), _empty(handle, (8, 4))
    kdbkit.activation_forward(handle, x2, "relu", y=y2)  # another shape
    assert len(full_path_calls) == 4
    host = rng.standard_normal((4, 8)).astype(np.float32)
    for _ in range(2):  # NumPy operands and allocated outputs leave no plan
        kdbkit.activation_forward(handle, host, "relu")
        kdbkit.activation_forward(handle, x, "relu")
    assert len(full_path_calls) == 8
    leaky = kdbkit.activation_forward(handle, x, "leakyrelu", alpha=0.25, y=y)
    np.testing.assert_allclose(leaky.to_host(handle.backend),
                               activ_ref.forward(x.to_host(handle.backend), LEAKY, alpha=0.25))
    assert len(full_path_calls) == 8  # that one was planned


def test_numerics_checks_and_command_logging_see_every_call(handle, full_path_calls, monkeypatch, capsys):
    x, y = _device(handle, np.ones((2, 8))), _empty(handle, (2, 8))
    kdbkit.activation_forward(handle, x, "relu", y=y)
    kdbkit.activation_forward(handle, x, "relu", y=y)
    assert len(full_path_calls) == 1
    monkeypatch.setenv("KDB_ENABLE_LOGGING_CMD", "1")
    configure_logging(force=True)
    try:
        kdbkit.activation_forward(handle, x, "relu", y=y)
    finally:
        monkeypatch.delenv("KDB_ENABLE_LOGGING_CMD")
        configure_logging(force=True)
    assert len(full_path_calls) == 2 and "kdb driver activ" in capsys.readouterr().err
    monkeypatch.setenv("KDB_CHECK_NUMERICS", "0x04")
    zeros = _device(handle, np.zeros((2, 8)))
    with pytest.raises(kdbkit.NumericsError):
        kdbkit.activation_forward(handle, zeros, "relu", y=y)


def test_outputs_given_to_layer_norm_and_batch_norm_training_are_planned(handle, full_path_calls):
    rng = np.random.default_rng(3)
    host = rng.standard_normal((5, 16)).astype(np.float32)
    w, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    x, wd, bd = _device(handle, host), _device(handle, w), _device(handle, b)
    y, mean, rstd = _empty(handle, (5, 16)), _empty(handle, (5,)), _empty(handle, (5,))
    for _ in range(2):
        out = kdbkit.layernorm_forward(handle, x, wd, bd, y=y, mean=mean, rstd=rstd)
        assert out == (y, mean, rstd)
    ry, rm, rr = ln_ref.forward(host, w, b, 1)
    np.testing.assert_allclose(y.to_host(handle.backend), ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean.to_host(handle.backend), rm, rtol=1e-5, atol=1e-6)
    image = _device(handle, rng.standard_normal((2, 3, 4, 4)))
    scale, shift = _device(handle, np.ones(3)), _device(handle, np.zeros(3))
    out, sm, si = _empty(handle, (2, 3, 4, 4)), _empty(handle, (3,)), _empty(handle, (3,))
    for _ in range(2):
        result = kdbkit.batchnorm_training(handle, image, scale, shift, y=out, saved_mean=sm, saved_invstd=si)
        assert result == (out, sm, si)
    np.testing.assert_allclose(sm.to_host(handle.backend), image.to_host(handle.backend).mean(axis=(0, 2, 3)),
                               rtol=1e-5, atol=1e-6)
    assert len(full_path_calls) == 2


def test_a_repeat_call_takes_the_solver_a_new_find_ranked_first(handle):
    """find ranks a problem anew: the next call, repeat or not, runs the new best, not the plan
    kept for the old choice."""
    from kdbkit.kdb.find_db import FindRecord
    from kdbkit.runtime.solver import REGISTRY

    x, y = _device(handle, np.linspace(-1, 1, 240, dtype=np.float32).reshape(6, 40)), _empty(handle, (6, 40))
    kdbkit.activation_forward(handle, x, "relu", y=y)  # leaves a plan with the heuristic's choice
    (config, choice), = handle.dispatcher.choices.items()
    other = next(s for s in REGISTRY.for_primitive(choice.solver.primitive)
                 if s is not choice.solver and s.is_applicable(kdbkit.parse_config(config), handle.device))
    handle.dispatcher.find_db.store(config, [FindRecord(other.id, other.name, 0, 0.001, 0)])
    handle.dispatcher.forget(config)  # what find_solutions does once it has stored a ranking
    kdbkit.activation_forward(handle, x, "relu", y=y)
    assert handle.dispatcher.choices[config].solver is other
    (plan,) = handle.dispatcher.plans.values()
    assert plan.invoker is handle.dispatcher.invokers[(config, other.id)]

