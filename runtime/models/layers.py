"""The layers the built-in networks share: convolution, batch norm, activation, pooling,
residual addition, fully connected (gemm + bias), layer norm and softmax.

Each is a :class:`~kdbkit.runtime.models.graph.Layer`: its kdbkit calls, its parameters
(PyTorch's names and layouts: a linear weight is out x in, a convolution's K x C/G x Y x X) and
its float64 NumPy and PyTorch references. Initialisation is He-style (normal with variance
gain / fan-in), so that activations stay of order one through the depth; batch norm's running
variance is drawn positive.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.models.graph import Layer, Param, Shape, Site, in_memory_order, normal, uniform, view
from kdbkit.runtime.primitives.activation.problem import ActivationMode
from kdbkit.runtime.primitives.convolution.problem import layout_strides
from kdbkit.runtime.reference import activation as ref_activation
from kdbkit.runtime.reference import convolution as ref_convolution
from kdbkit.runtime.reference import pooling as ref_pooling
from kdbkit.runtime.tensor import TensorDesc


def _functional():
    import torch.nn.functional as F  # PyTorch is only needed for the PyTorch references

    return F


class Conv(Layer):
    """2-D convolution (torch.nn.Conv2d), optionally with a bias (kdbkit's convolution bias).

    Args:
        gain: the weights' variance is gain / fan-in: 2 before a ReLU (He), 1 before none.
    """

    def __init__(self, out_channels: int, kernel: int, *, stride: int = 1, pad: int = 0, groups: int = 1,
                 bias: bool = False, gain: float = 2.0):
        self.k, self.kernel, self.stride, self.pad, self.groups = out_channels, kernel, stride, pad, groups
        self.bias, self.gain = bias, gain

    def out_shape(self, x: Shape) -> Shape:
        n, _, h, w = x
        return (n, self.k, *((s + 2 * self.pad - self.kernel) // self.stride + 1 for s in (h, w)))

    def params(self, x: Shape) -> dict[str, Param]:
        fan_in = x[1] // self.groups * self.kernel * self.kernel
        params = {"weight": Param((self.k, x[1] // self.groups, self.kernel, self.kernel),
                                  normal(math.sqrt(self.gain / fan_in)))}
        if self.bias:
            params["bias"] = Param((self.k,), normal(0.05))
        return params

    def param_desc(self, name, param, dtype, layout, shapes) -> TensorDesc:
        if name == "weight":  # the weights take the layout too: K x C x Y x X, or K x Y x X x C
            return TensorDesc(dtype, param.shape, layout_strides(layout, param.shape))
        return super().param_desc(name, param, dtype, layout, shapes)

    def param_memory(self, name, value, layout, shapes) -> np.ndarray:
        return value.transpose(0, 2, 3, 1) if name == "weight" and layout == "NHWC" else value

    def run(self, k, handle, site: Site) -> None:
        k.convolution_forward(handle, site.ins[0], site.params["weight"], pad=self.pad, stride=self.stride,
                              groups=self.groups, y=site.out)
        if self.bias:
            k.convolution_bias_forward(handle, site.out, site.params["bias"])

    def run_fused(self, k, handle, site: Site, out, scale, shift, residual, activation: str) -> None:
        """This convolution, its batch norm folded into ``scale`` and ``shift``, then
        ``residual`` added and ``activation``, as one convolution_forward_fused call writing
        ``out`` (runtime/models/fusion.py)."""
        k.convolution_forward_fused(handle, site.ins[0], site.params["weight"], scale, shift, residual=residual,
                                    activation=activation, pad=self.pad, stride=self.stride, groups=self.groups,
                                    y=out)

    def reference(self, p, x) -> np.ndarray:
        y = ref_convolution.forward(x, p["weight"], (self.pad,) * 2, (self.stride,) * 2, groups=self.groups)
        return y + p["bias"].reshape(1, -1, 1, 1) if self.bias else y

    def torch(self, p, x) -> Any:
        return _functional().conv2d(x, p["weight"], p.get("bias"), self.stride, self.pad, 1, self.groups)


class BatchNorm(Layer):
    """Spatial batch norm in inference mode (torch.nn.BatchNorm2d in eval()), over N x C x H x W.

    Args:
        scale: the range the scale (gamma) is drawn from; a small one on a residual branch's
            last batch norm keeps the sum of the blocks of order one.
    """

    inplace = True

    def __init__(self, *, eps: float = 1e-5, scale: tuple[float, float] = (0.6, 1.2)):
        self.eps, self.scale = eps, scale

    def out_shape(self, x: Shape) -> Shape:
        return x

    def params(self, x: Shape) -> dict[str, Param]:
        c = (x[1],)
        return {"weight": Param(c, uniform(*self.scale), True), "bias": Param(c, normal(0.1), True),
                "running_mean": Param(c, normal(0.1), True), "running_var": Param(c, uniform(0.5, 1.5), True)}

    def run(self, k, handle, site: Site) -> None:
        p = site.params
        k.batchnorm_inference(handle, site.ins[0], p["weight"], p["bias"], p["running_mean"], p["running_var"],
                              eps=self.eps, y=site.out)

    def reference(self, p, x) -> np.ndarray:
        c = (1, -1, 1, 1)
        return (x - p["running_mean"].reshape(c)) / np.sqrt(p["running_var"].reshape(c) + self.eps) * \
            p["weight"].reshape(c) + p["bias"].reshape(c)

    def torch(self, p, x) -> Any:
        return _functional().batch_norm(x, p["running_mean"], p["running_var"], p["weight"], p["bias"], False, 0.0,
                                        self.eps)


class Activation(Layer):
    """An elementwise activation: ``relu``, ``clippedrelu`` with alpha 6 (ReLU6) or ``gelu_erf``."""

    inplace = True

    def __init__(self, mode: str = "relu", alpha: float = 0.0):
        self.mode, self.alpha = ActivationMode.parse(mode), alpha

    def out_shape(self, x: Shape) -> Shape:
        return x

    def run(self, k, handle, site: Site) -> None:
        k.activation_forward(handle, in_memory_order(site.ins[0]), self.mode, alpha=self.alpha,
                             y=in_memory_order(site.out))

    def reference(self, p, x) -> np.ndarray:
        return ref_activation.forward(x, int(self.mode), self.alpha)

    def torch(self, p, x) -> Any:
        F = _functional()
        if self.mode is ActivationMode.RELU:
            return F.relu(x)
        if self.mode is ActivationMode.CLIPPEDRELU:
            return F.hardtanh(x, 0.0, self.alpha)
        if self.mode is ActivationMode.GELU_ERF:
            return F.gelu(x)
        raise NotImplementedError(f"no PyTorch reference for activation {self.mode.label}")


class MaxPool(Layer):
    """Max pooling (torch.nn.MaxPool2d); no indices are kept (inference)."""

    def __init__(self, window: int, stride: int, pad: int = 0):
        self.window, self.stride, self.pad = window, stride, pad

    def out_shape(self, x: Shape) -> Shape:
        n, c, h, w = x
        return (n, c, *((s + 2 * self.pad - self.window) // self.stride + 1 for s in (h, w)))

    def run(self, k, handle, site: Site) -> None:
        k.pooling_forward(handle, site.ins[0], mode="max", window=self.window, stride=self.stride, pad=self.pad,
                          save_indices=False, y=site.out)

    def reference(self, p, x) -> np.ndarray:
        return ref_pooling.forward(x, "max", (self.window,) * 2, (self.stride,) * 2, (self.pad,) * 2)[0]

    def torch(self, p, x) -> Any:
        return _functional().max_pool2d(x, self.window, self.stride, self.pad)


class GlobalAvgPool(Layer):
    """The average of each H x W plane (torch.nn.AdaptiveAvgPool2d(1)): average pooling with
    the whole plane as its window; N x C x 1 x 1 out."""

    def out_shape(self, x: Shape) -> Shape:
        return (*x[:2], 1, 1)

    def run(self, k, handle, site: Site) -> None:
        plane = site.ins[0].desc.shape[2:]
        k.pooling_forward(handle, site.ins[0], mode="avg", window=plane, stride=plane, pad=0, save_indices=False,
                          y=site.out)

    def reference(self, p, x) -> np.ndarray:
        return x.mean(axis=(2, 3), keepdims=True)

    def torch(self, p, x) -> Any:
        return _functional().adaptive_avg_pool2d(x, 1)


class Add(Layer):
    """The sum of two values of one shape (a residual connection): op_tensor add."""

    inplace = True

    def out_shape(self, a: Shape, b: Shape) -> Shape:
        if a != b:
            raise ProblemError(f"adding values of shapes {a} and {b}", "add values of one shape")
        return a

    def run(self, k, handle, site: Site) -> None:
        a, b = site.ins
        k.op_tensor(handle, "add", in_memory_order(a), in_memory_order(b), c=in_memory_order(site.out))

    def reference(self, p, a, b) -> np.ndarray:
        return a + b

    def torch(self, p, a, b) -> Any:
        return a + b


class Linear(Layer):
    """A fully connected layer (torch.nn.Linear): ``x @ weight.T + bias`` as a gemm (weight
    out x in, transposed by the gemm) and an op_tensor add of the broadcast bias.

    An image (N x C x H x W) is flattened first, in PyTorch's C, H, W order; channels-last,
    the weight's columns are stored in H, W, C order instead, so the gemm reads the image as
    it lies. Other inputs keep their leading dimensions: (..., in) -> (..., out).
    """

    def __init__(self, out_features: int, *, bias: bool = True, gain: float = 1.0):
        self.out_features, self.bias, self.gain = out_features, bias, gain

    @staticmethod
    def _rows_features(x: Shape) -> tuple[int, int]:
        if len(x) == 4:
            return x[0], x[1] * x[2] * x[3]
        return math.prod(x[:-1]), x[-1]  # math's, not NumPy's: every forward calls this per linear layer

    def out_shape(self, x: Shape) -> Shape:
        return (x[0], self.out_features) if len(x) == 4 else (*x[:-1], self.out_features)

    def params(self, x: Shape) -> dict[str, Param]:
        features = self._rows_features(x)[1]
        params = {"weight": Param((self.out_features, features), normal(math.sqrt(self.gain / features)))}
        if self.bias:
            params["bias"] = Param((self.out_features,), normal(0.05))
        return params

    def param_memory(self, name, value, layout, shapes) -> np.ndarray:
        x = shapes[0]
        if name == "weight" and len(x) == 4 and layout == "NHWC":
            return value.reshape(self.out_features, *x[1:]).transpose(0, 2, 3, 1).reshape(value.shape)
        return value

    def run(self, k, handle, site: Site) -> None:
        x = site.ins[0]
        rows, features = self._rows_features(x.desc.shape)
        out = view(site.out, (rows, self.out_features))
        k.gemm(handle, view(x, (rows, features)), site.params["weight"], trans_b=True, c=out)
        if self.bias:
            k.op_tensor(handle, "add", out, site.params["bias"], c=out)

    def run_fused(self, k, handle, site: Site, out, scale, shift, residual, activation: str) -> None:
        """This layer, its bias as the float32 ``shift`` (``scale`` None), then ``residual``
        added and ``activation``, as one gemm_fused call writing ``out`` (runtime/models/fusion.py)."""
        x = site.ins[0]
        rows, features = self._rows_features(x.desc.shape)
        matrix = (rows, self.out_features)
        k.gemm_fused(handle, view(x, (rows, features)), site.params["weight"], shift, scale=scale,
                     residual=None if residual is None else view(residual, matrix), activation=activation,
                     trans_b=True, c=view(out, matrix))

    def reference(self, p, x) -> np.ndarray:
        flat = x.reshape(x.shape[0], -1) if x.ndim == 4 else x
        y = flat @ p["weight"].T
        return y + p["bias"] if self.bias else y

    def torch(self, p, x) -> Any:
        return _functional().linear(x.flatten(1) if x.dim() == 4 else x, p["weight"], p.get("bias"))


class LayerNorm(Layer):
    """Layer norm over the last dimension with a weight and a bias (torch.nn.LayerNorm); its
    per-row mean and 1/std are written to float32 scratch tensors."""

    def __init__(self, *, eps: float = 1e-12):
        self.eps = eps

    def out_shape(self, x: Shape) -> Shape:
        return x

    def params(self, x: Shape) -> dict[str, Param]:
        return {"weight": Param((x[-1],), uniform(0.8, 1.2)), "bias": Param((x[-1],), normal(0.05))}

    def scratch(self, x: Shape) -> dict[str, Shape]:
        return {"mean": x[:-1], "rstd": x[:-1]}

    def run(self, k, handle, site: Site) -> None:
        k.layernorm_forward(handle, site.ins[0], site.params["weight"], site.params["bias"], dim=-1, eps=self.eps,
                            y=site.out, mean=site.scratch["mean"], rstd=site.scratch["rstd"])

    def reference(self, p, x) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * p["weight"] + p["bias"]

    def torch(self, p, x) -> Any:
        return _functional().layer_norm(x, (x.shape[-1],), p["weight"], p["bias"], self.eps)


class Softmax(Layer):
    """Softmax over the last dimension (accurate: the row's maximum subtracted first)."""

    def out_shape(self, x: Shape) -> Shape:
        return x

    def run(self, k, handle, site: Site) -> None:
        shape = site.ins[0].desc.shape
        rows = (int(np.prod(shape[:-1])), shape[-1])
        k.softmax_forward(handle, view(site.ins[0], rows), algorithm="accurate", mode="channel",
                          y=view(site.out, rows))

    def reference(self, p, x) -> np.ndarray:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def torch(self, p, x) -> Any:
        return _functional().softmax(x, dim=-1)

