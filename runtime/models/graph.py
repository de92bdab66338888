"""A network as data: layers over named values, with every value's shape and every parameter's.

A :class:`Graph` is built once per input shape by a model's builder (``resnet.py``, ...): the
input value ``x``, then one :class:`Node` per layer, each reading earlier values and writing a
new one. A :class:`Layer` says, in one place, everything about what it computes: its output
shape, its parameters (named as torchvision's or Hugging Face's state dicts name them, so the
weights load into those models unchanged) and how they are initialised and laid out on the
device, its kdbkit calls (:meth:`Layer.run`, written against ``k``, which is the ``kdbkit``
package in a forward and a :class:`~kdbkit.runtime.models.dry_run.DryRun` when listing problems),
and its float64 NumPy and PyTorch references. Nothing here touches a device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution.problem import layout_strides
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

Shape = tuple[int, ...]
LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class Param:
    """A parameter: its shape, how to draw it (``init(rng, shape)`` in float64), and whether it
    stays float32 whatever the network's type (batch norm's statistics and affine terms)."""

    shape: Shape
    init: Callable[[np.random.Generator, Shape], np.ndarray]
    float32: bool = False


def normal(std: float) -> Callable[[np.random.Generator, Shape], np.ndarray]:
    return lambda rng, shape: rng.standard_normal(shape) * std


def uniform(low: float, high: float) -> Callable[[np.random.Generator, Shape], np.ndarray]:
    return lambda rng, shape: rng.uniform(low, high, shape)


def value_desc(dtype: DataType, shape: Shape, layout: str) -> TensorDesc:
    """A graph value on the device: 4-D (N x C x H x W) values in the network's layout, the rest packed."""
    if len(shape) == 4:
        return TensorDesc(dtype, tuple(shape), layout_strides(layout, tuple(shape)))
    return TensorDesc.packed(dtype, shape)


def view(t: DeviceTensor, shape: Shape, strides: Shape | None = None) -> DeviceTensor:
    """The same buffer seen with another shape (packed unless ``strides`` are given).

    A forward asks for the same views of the same buffers every time: each buffer remembers
    its views (a few dozen at most), so a repeat forward makes no descriptor (making and
    checking them was a good part of a forward's host time)."""
    buffer, key = t.buffer, (t.desc.dtype, shape, strides)
    views = getattr(buffer, "_kdb_views", None)
    if views is not None:
        try:
            made = views.get(key)
        except TypeError:  # a list for a shape: not remembered
            made = None
        if made is not None:
            return made
    desc = TensorDesc(t.desc.dtype, tuple(shape), tuple(strides)) if strides is not None else \
        TensorDesc.packed(t.desc.dtype, shape)
    made = DeviceTensor(buffer, desc)
    if buffer is not None and isinstance(shape, tuple) and (strides is None or isinstance(strides, tuple)):
        if views is None:
            views = buffer._kdb_views = {}
        if len(views) < _MAX_VIEWS:
            views[key] = made
    return made


_MAX_VIEWS = 64  # per buffer


def in_memory_order(t: DeviceTensor) -> DeviceTensor:
    """A dense tensor as its elements lie in memory: a channels-last N x C x H x W tensor as the
    packed N x H x W x C one. Elementwise calls take this view, so that they take the packed
    (vectorised) solvers in either layout."""
    desc = t.desc
    if len(desc.shape) == 4 and not desc.is_packed:
        n, c, h, w = desc.shape
        return view(t, (n, h, w, c))
    return t


@dataclass
class Site:
    """One node's tensors: inputs, output, parameters and scratch, by the layer's names.
    Device tensors in a forward; descriptor-only ones (``buffer=None``) in a dry run."""

    ins: list[DeviceTensor]
    out: DeviceTensor
    params: dict[str, DeviceTensor] = field(default_factory=dict)
    scratch: dict[str, DeviceTensor] = field(default_factory=dict)


class Layer(ABC):
    """One layer's description; see the module's docstring."""

    #: The output may share input 0's buffer (elementwise layers), when nothing reads it later.
    inplace: bool = False

    @abstractmethod
    def out_shape(self, *shapes: Shape) -> Shape:
        """The output's shape from the inputs' (N x C x H x W for images)."""

    def params(self, *shapes: Shape) -> dict[str, Param]:
        """Parameters by their name within the layer (``weight``, ``bias``, ...)."""
        return {}

    def scratch(self, *shapes: Shape) -> dict[str, Shape]:
        """Float32 work tensors the layer's calls write besides the output."""
        return {}

    def work(self, *shapes: Shape) -> dict[str, Shape]:
        """Work tensors in the network's own type (packed), by name, beside :meth:`scratch`'s.
        They hold nothing between runs of the layer, so layers share their memory."""
        return {}

    def param_desc(self, name: str, param: Param, dtype: DataType, layout: str, shapes: tuple[Shape, ...]) -> TensorDesc:
        """How a parameter lies on the device: packed, in the network's type (or float32)."""
        return TensorDesc.packed(DataType.FP32 if param.float32 else dtype, param.shape)

    def param_memory(self, name: str, value: np.ndarray, layout: str, shapes: tuple[Shape, ...]) -> np.ndarray:
        """A parameter's values in the order :meth:`param_desc` lays them out."""
        return value

    @abstractmethod
    def run(self, k: Any, handle: Any, site: Site) -> None:
        """The layer's kdbkit calls (``k.gemm(handle, ...)``, ...), writing ``site.out``."""

    @abstractmethod
    def reference(self, p: dict[str, np.ndarray], *xs: np.ndarray) -> np.ndarray:
        """The same layer in float64 NumPy (inputs and output N x C x H x W for images)."""

    @abstractmethod
    def torch(self, p: dict[str, Any], *xs: Any) -> Any:
        """The same layer with PyTorch (``p`` holds torch tensors), for comparisons on a GPU."""


@dataclass(frozen=True)
class Node:
    """A layer applied to earlier values; ``name`` prefixes its parameters (``layer1.0.conv1``)."""

    name: str
    layer: Layer
    inputs: tuple[str, ...]
    output: str


class Graph:
    """Layers over named values, built for one input shape.

    Args:
        input_shape: the input value ``x``'s shape (N x C x H x W for image networks).
        layouts: the 4-D layouts the network runs in (NCHW and NHWC for image networks).
    """

    def __init__(self, input_shape: Shape, layouts: tuple[str, ...] = LAYOUTS):
        self.input = "x"
        self.shapes: dict[str, Shape] = {self.input: tuple(int(s) for s in input_shape)}
        self.nodes: list[Node] = []
        self.layouts = layouts

    def add(self, layer: Layer, *inputs: str, name: str = "") -> str:
        """Apply ``layer`` to the values ``inputs``; returns the new value's name.

        Raises:
            ProblemError: an input that is not a value yet, or shapes the layer cannot take.
        """
        for value in inputs:
            if value not in self.shapes:
                raise ProblemError(f"layer {name or type(layer).__name__} reads {value!r}, which is not a value yet",
                                   "add the layer that makes it first")
        output = f"v{len(self.nodes) + 1}"
        self.shapes[output] = tuple(layer.out_shape(*(self.shapes[v] for v in inputs)))
        self.nodes.append(Node(name, layer, tuple(inputs), output))
        return output

    @property
    def output(self) -> str:
        return self.nodes[-1].output if self.nodes else self.input

    def in_shapes(self, node: Node) -> tuple[Shape, ...]:
        return tuple(self.shapes[v] for v in node.inputs)

    def param_specs(self) -> dict[str, tuple[Node, str, Param]]:
        """Every parameter by its full name (``layer1.0.conv1.weight``): its node, own name and spec."""
        specs = {}
        for node in self.nodes:
            for own, param in node.layer.params(*self.in_shapes(node)).items():
                specs[f"{node.name}.{own}" if node.name else own] = (node, own, param)
        return specs

    def last_reads(self) -> dict[str, int]:
        """Each value's last reader (a node index); the output is read after the last node."""
        last = {self.input: -1}
        for i, node in enumerate(self.nodes):
            for value in node.inputs:
                last[value] = i
        last[self.output] = len(self.nodes)
        return last
