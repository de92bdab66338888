"""The problems a network's kdbkit calls ask the solvers for, found without a device.

:class:`DryRun` has the primitive functions a network layer calls (``gemm``,
``convolution_forward``, ...) with kdbkit's signatures, over tensors that carry only a
descriptor. Each builds the Problem the real function builds from the same tensors and records
it instead of running anything. A layer is written once, as calls on ``k`` (the ``kdbkit``
package for a forward, a DryRun for its catalogue), so its catalogue is the problems its
forward runs; ``tests/runtime/models`` checks that against the solvers' own view.
"""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem
from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.primitives.convolution.bias import ConvBiasProblem
from kdbkit.runtime.primitives.convolution.epilogue import ConvEpilogueProblem
from kdbkit.runtime.primitives.convolution.problem import ConvProblem, layouts_of
from kdbkit.runtime.primitives.gemm.fused import epilogue_problem
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem
from kdbkit.runtime.primitives.pooling.problem import PoolProblem
from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem, as_nchw
from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.tensor import TensorDesc


def _pair(value) -> tuple[int, int]:
    """(h, w) from a pair or one int, as the APIs take pad, stride and window."""
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) else (int(value), int(value))


def _gemm_operand(desc: TensorDesc) -> tuple[int, int, int, int, int]:
    """(batch, rows, cols, row stride, batch stride), as kdbkit's gemm reads a 2-D or 3-D operand."""
    batch = desc.shape[0] if len(desc.shape) == 3 else 1
    rows, cols = desc.shape[-2:]
    row_stride = max(desc.strides[-2], cols) if rows > 1 else cols
    return batch, rows, cols, row_stride, (desc.strides[0] if len(desc.shape) == 3 and batch > 1 else 0)


class DryRun:
    """kdbkit's primitive functions as used by the networks, recording problems instead of running.

    Tensors are anything with a ``desc`` (a :class:`~kdbkit.runtime.tensor.DeviceTensor` whose
    buffer may be ``None``); outputs are always given, as the networks always give them.
    """

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def _record(self, problem: Problem) -> None:
        self.problems.append(problem)

    def convolution_forward(self, handle, x: Any, w: Any, *, pad=0, stride=1, dilation=1, groups: int = 1,
                            y: Any) -> Any:
        xd, wd = x.desc, w.desc
        common = layouts_of(xd) & layouts_of(wd)  # as the API: NCHW where both layouts fit
        layout = "NCHW" if "NCHW" in common else "NHWC"
        self._record(ConvProblem("F", wd.dtype, layout, xd.shape, wd.shape[0], wd.shape[2:], _pair(pad),
                                 _pair(stride), _pair(dilation), int(groups)))
        return y

    def convolution_forward_fused(self, handle, x: Any, w: Any, scale: Any, shift: Any, *, residual: Any = None,
                                  activation: str = "none", pad=0, stride=1, dilation=1, groups: int = 1,
                                  y: Any) -> Any:
        """The convolution's problem, and the epilogue's: its pass runs where the chosen solver's
        kernel does not take the epilogue, so a bundle carries its program."""
        self.convolution_forward(handle, x, w, pad=pad, stride=stride, dilation=dilation, groups=groups, y=y)
        yd = y.desc
        self._record(ConvEpilogueProblem(yd.dtype, yd.shape, yd.strides, residual is not None, activation))
        return y

    def convolution_bias_forward(self, handle, y: Any, bias: Any) -> Any:
        self._record(ConvBiasProblem("fwd", y.desc.dtype, y.desc.shape, y.desc.strides))
        return y

    def batchnorm_inference(self, handle, x: Any, scale, bias, mean, var, *, mode: str = "spatial",
                            eps: float = 1e-5, y: Any) -> Any:
        xd = x.desc
        self._record(BatchNormProblem("infer", mode, xd.dtype, xd.shape, xd.strides, y.desc.strides, float(eps)))
        return y

    def activation_forward(self, handle, x: Any, mode="relu", *, alpha: float = 0.0, beta: float = 0.0,
                           gamma: float = 0.0, y: Any) -> Any:
        xd = x.desc
        self._record(ActivationProblem("fwd", ActivationMode.parse(mode), xd.dtype, xd.shape, xd.strides,
                                       y.desc.strides, float(alpha), float(beta), float(gamma)))
        return y

    def pooling_forward(self, handle, x: Any, *, mode: str = "max", window=(2, 2), stride=None, pad=(0, 0),
                        save_indices: bool = True, y: Any) -> tuple[Any, None]:
        window = _pair(window)
        stride, pad = _pair(stride if stride is not None else window), _pair(pad)
        xd = x.desc
        keep = bool(save_indices) and mode == "max"
        self._record(PoolProblem("fwd", mode, xd.dtype, xd.shape, window, stride, pad, xd.strides, y.desc.strides,
                                 keep))
        return y, None

    def op_tensor(self, handle, op: str, a: Any, b: Any, *, alpha1: float = 1.0, alpha2: float = 1.0,
                  beta: float = 0.0, c: Any) -> Any:
        ad, bd = a.desc, b.desc
        self._record(TensorOpProblem(op, ad.dtype, ad.shape, ad.strides, bd.shape, bd.strides, c.desc.strides,
                                     float(alpha1), float(alpha2), float(beta)))
        return c

    def gemm(self, handle, a: Any, b: Any, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
             beta: float = 0.0, c: Any) -> Any:
        batch_a, ra, ca, lda, sa = _gemm_operand(a.desc)
        batch_b, rb, cb, ldb, sb = _gemm_operand(b.desc)
        _, _, _, ldc, sc = _gemm_operand(c.desc)
        m, k = (ca, ra) if trans_a else (ra, ca)
        n = rb if trans_b else cb
        self._record(GemmProblem(a.desc.dtype, m, n, k, bool(trans_a), bool(trans_b), max(batch_a, batch_b), lda,
                                 ldb, ldc, sa if batch_a > 1 else 0, sb if batch_b > 1 else 0, sc, float(alpha),
                                 float(beta)))
        return c

    def gemm_fused(self, handle, a: Any, b: Any, shift: Any, *, scale: Any = None, residual: Any = None,
                   activation: str = "none", trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
                   c: Any) -> Any:
        """The gemm's problem, and the epilogue's: its pass runs where the chosen solver's kernel
        does not take the epilogue, so a bundle carries its program."""
        self.gemm(handle, a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, c=c)
        self._record(epilogue_problem(self.problems[-1], c.desc, residual is not None, activation, scale is not None))
        return c

    def softmax_forward(self, handle, x: Any, *, algorithm: str = "accurate", mode: str = "channel",
                        alpha: float = 1.0, beta: float = 0.0, y: Any) -> Any:
        xd, yd = x.desc, y.desc
        shape, xs = as_nchw(xd.shape, xd.strides)
        self._record(SoftmaxProblem("fwd", algorithm, mode, xd.dtype, shape, xs, as_nchw(yd.shape, yd.strides)[1],
                                    float(alpha), float(beta)))
        return y

    def layernorm_forward(self, handle, x: Any, weight: Any = None, bias: Any = None, *, dim: int = -1,
                          eps: float = 1e-5, y: Any, mean: Any, rstd: Any) -> tuple[Any, Any, Any]:
        xd = x.desc
        dim = dim + len(xd.shape) if dim < 0 else dim
        self._record(LayerNormProblem("fwd", xd.dtype, xd.shape, dim, weight is not None, float(eps)))
        return y, mean, rstd
