"""convolution_forward, convolution_backward_data and convolution_backward_weights.

Tensors are N x C x H x W (weights K x C/G x Y x X) whatever their layout: NumPy arrays are
taken as packed NCHW; device tensors (PyTorch, CuPy, kdbkit's) may also be channels-last
(NHWC, weights KYXC), and then every tensor of the call must be. The layout is inferred from
every tensor given, outputs included: inputs with one channel are packed both ways, and a
channels-last output then makes the call channels-last. Outputs kdbkit allocates take the
inputs' layout (NCHW where they fit both).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution.problem import LAYOUTS, ConvProblem, _pair, layouts_of
from kdbkit.runtime.primitives.arguments import integer
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.tensor import TensorDesc


def _four_d(desc: TensorDesc, what: str) -> None:
    if len(desc.shape) != 4:
        raise ProblemError(f"{what} is {len(desc.shape)}-D; convolution takes 4-D tensors "
                           f"(N x C x H x W, weights K x C/G x Y x X)", "reshape it to 4-D")


def _layouts(descs: dict[str, TensorDesc]) -> set[str]:
    """The layouts every given tensor is packed in: one, or both (one channel, 1 x 1 filters).

    Raises:
        ProblemError: a tensor packed in neither layout, or tensors in different ones (named).
    """
    common = set(LAYOUTS)
    for what, desc in descs.items():
        found = layouts_of(desc)
        if not found:
            raise ProblemError(f"{what} has strides {desc.strides} for shape {desc.shape}: neither packed NCHW nor "
                               "packed NHWC (channels-last)", f"make {what} contiguous in one of those layouts")
        if not common & found:
            listed = ", ".join(f"{w} {'/'.join(sorted(layouts_of(d)))}" for w, d in descs.items())
            raise ProblemError(f"the tensors' layouts differ ({listed})", "give every tensor the same layout")
        common &= found
    return common


def _layout(descs: dict[str, TensorDesc]) -> str:
    """The layout every given tensor is packed in (NCHW where both would do, until an output decides)."""
    return "NCHW" if "NCHW" in _layouts(descs) else "NHWC"


def _check_same_type(descs: dict[str, TensorDesc]) -> None:
    types = {d.dtype for d in descs.values()}
    if len(types) > 1:
        listed = ", ".join(f"{w} {d.dtype.label}" for w, d in descs.items())
        raise ProblemError(f"the tensors' types differ ({listed})", "give every tensor the same type")


def _problem(direction: str, x_shape, w_desc: TensorDesc, descs: dict[str, TensorDesc], pad, stride, dilation,
             groups: int) -> ConvProblem:
    """The problem, after the checks that name a tensor."""
    _check_same_type(descs)
    groups = integer(groups, "groups", "convolution")
    k, cg = w_desc.shape[:2]
    if groups < 1 or x_shape[1] != cg * groups:
        raise ProblemError(f"w is {'x'.join(map(str, w_desc.shape))}: {cg} channels per group, but x has "
                           f"{x_shape[1]} channels in {groups} groups", "w must be K x C/groups x Y x X")
    return ConvProblem(direction, w_desc.dtype, _layout(descs), tuple(x_shape), k, w_desc.shape[2:],
                       _pair(pad, "pad"), _pair(stride, "stride"), _pair(dilation, "dilation"), groups)


def _output(ops, handle, given, like_input, problem: ConvProblem, tensor: str, what: str,
            inputs: dict[str, TensorDesc]):
    """The output's buffer, descriptor and returned value, and the problem in the layout every
    tensor, the output included, is packed in: inputs packed both ways (one channel) take a
    given output's layout."""
    desc = problem.descs()[tensor]
    buffer, got, result = ops.output(device_default(handle, given, like_input, desc, keep_strides=True), desc, what)
    if problem.layout not in layouts_of(got):
        allowed = _layouts(inputs) & layouts_of(got)
        if not allowed:
            raise ProblemError(f"{what} has strides {got.strides}, not packed {'/'.join(sorted(_layouts(inputs)))} "
                               "as the inputs are", f"give {what} the inputs' layout, or pass None for a new one")
        problem = replace(problem, layout=allowed.pop())
    return buffer, got, result, problem


@repeatable("conv_fwd", ("x", "w", "y"))
def convolution_forward(handle, x: Any, w: Any, *, pad=0, stride=1, dilation=1, groups: int = 1, y: Any = None,
                        dtype: str | None = None, solver: int | str | None = None) -> Any:
    """y (N x K x Ho x Wo) = x (N x C x H x W) convolved with w (K x C/groups x Y x X).

    Args:
        pad, stride, dilation: (h, w) pairs or one int.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        wb, wd = ops.input(w, dtype, "w")
        _four_d(xd, "x"), _four_d(wd, "w")
        problem = _problem("F", xd.shape, wd, {"x": xd, "w": wd}, pad, stride, dilation, groups)
        yb, yd, result, problem = _output(ops, handle, y, x, problem, "y", "y", {"x": xd, "w": wd})
        invoke(handle, problem, solver, {"x": (xb, xd), "w": (wb, wd)}, {"y": (yb, yd)})
    return result


@repeatable("conv_bwd_data", ("dy", "w", "dx"))
def convolution_backward_data(handle, dy: Any, w: Any, x_shape: tuple[int, ...], *, pad=0, stride=1, dilation=1,
                              groups: int = 1, dx: Any = None, dtype: str | None = None,
                              solver: int | str | None = None) -> Any:
    """dx (``x_shape``, N x C x H x W) from the output gradient dy and the weights w.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        dyb, dyd = ops.input(dy, dtype, "dy")
        wb, wd = ops.input(w, dtype, "w")
        _four_d(dyd, "dy"), _four_d(wd, "w")
        x_shape = tuple(integer(s, "x_shape") for s in x_shape)
        if len(x_shape) != 4:
            raise ProblemError(f"x_shape {x_shape} is not N x C x H x W", "give the forward input's 4-D shape")
        problem = _problem("B", x_shape, wd, {"dy": dyd, "w": wd}, pad, stride, dilation, groups)
        if dyd.shape != problem.y_shape:
            raise ProblemError(f"dy is {'x'.join(map(str, dyd.shape))}, but convolving {'x'.join(map(str, x_shape))} "
                               f"gives {'x'.join(map(str, problem.y_shape))}", "pass the gradient of the forward output")
        dxb, dxd, result, problem = _output(ops, handle, dx, dy, problem, "x", "dx", {"dy": dyd, "w": wd})
        invoke(handle, problem, solver, {"dy": (dyb, dyd), "w": (wb, wd)}, {"dx": (dxb, dxd)})
    return result


@repeatable("conv_bwd_weights", ("dy", "x", "dw"))
def convolution_backward_weights(handle, dy: Any, x: Any, w_shape: tuple[int, ...], *, pad=0, stride=1,
                                 dilation=1, groups: int = 1, dw: Any = None, dtype: str | None = None,
                                 solver: int | str | None = None) -> Any:
    """dw (``w_shape``, K x C/groups x Y x X) from the output gradient dy and the input x.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        dyb, dyd = ops.input(dy, dtype, "dy")
        xb, xd = ops.input(x, dtype, "x")
        _four_d(dyd, "dy"), _four_d(xd, "x")
        w_shape = tuple(integer(s, "w_shape") for s in w_shape)
        if len(w_shape) != 4:
            raise ProblemError(f"w_shape {w_shape} is not K x C/groups x Y x X", "give the weights' 4-D shape")
        like = TensorDesc.packed(xd.dtype, w_shape)
        problem = _problem("W", xd.shape, like, {"dy": dyd, "x": xd}, pad, stride, dilation, groups)
        if dyd.shape != problem.y_shape:
            raise ProblemError(f"dy is {'x'.join(map(str, dyd.shape))}, but convolving x gives "
                               f"{'x'.join(map(str, problem.y_shape))}", "pass the gradient of the forward output")
        dwb, dwd, result, problem = _output(ops, handle, dw, x, problem, "w", "dw", {"dy": dyd, "x": xd})
        invoke(handle, problem, solver, {"dy": (dyb, dyd), "x": (xb, xd)}, {"dw": (dwb, dwd)})
    return result
