"""Which layers of an inference forward run as one fused call.

- A convolution (no bias) whose only reader is a batch norm, then optionally a residual
  addition of the batch norm's output (its first operand) and another value, then optionally
  ReLU, each the only reader of the one before: one :func:`kdbkit.convolution_forward_fused`
  call, the batch norm folded into a scale and shift per output channel
  (:func:`fold_batchnorm`). ResNet's convolution, batch norm, addition and ReLU become one
  kernel where the solver's kernel takes the epilogue, and the intermediate values are never
  written.
- A linear layer with a bias, then optionally a residual addition of its output (the first
  operand) and another value, then optionally ReLU or GELU, each the only reader of the one
  before: one :func:`kdbkit.gemm_fused` call, the bias its shift (float32). BERT's linear layers
  with their additions or GELU become the GEMM and one epilogue pass.

The graph itself is unchanged: its parameters, references and PyTorch version stay layer by
layer, so a fused forward is checked against the unfused float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.models.graph import Graph
from kdbkit.runtime.models.layers import Activation, Add, BatchNorm, Conv, Linear
from kdbkit.runtime.primitives.activation.problem import ActivationMode

# The activations an epilogue applies, by the activation layer's mode (the fused calls' names).
EPILOGUE_ACTIVATIONS = {ActivationMode.RELU: "relu", ActivationMode.GELU_ERF: "gelu_erf"}


@dataclass(frozen=True)
class Fusion:
    """Nodes ``first`` .. ``last`` (indices) as one call: a convolution and its batch norm
    (``bn``, its index) or a linear layer (``bn`` None); ``residual`` the value added (or
    None), ``activation`` what ends it (``none``, ``relu`` or ``gelu_erf``)."""

    first: int
    bn: int | None
    last: int
    residual: str | None
    activation: str

    @property
    def linear(self) -> bool:
        return self.bn is None


def find_fusions(graph: Graph) -> dict[int, Fusion]:
    """The fusions of ``graph``, by their first layer's index."""
    readers: dict[str, int] = {}
    for node in graph.nodes:
        for value in node.inputs:
            readers[value] = readers.get(value, 0) + 1
    readers[graph.output] = readers.get(graph.output, 0) + 1  # the caller reads the output

    def only_reader(i: int, value: str) -> bool:
        return i < len(graph.nodes) and readers.get(value) == 1 and graph.nodes[i].inputs.count(value) == 1

    found = {}
    nodes = graph.nodes
    for i, node in enumerate(nodes):
        if isinstance(node.layer, Conv) and not node.layer.bias:
            bn = i + 1
            if not (only_reader(bn, node.output) and isinstance(nodes[bn].layer, BatchNorm)):
                continue
            last, activations = bn, (ActivationMode.RELU,)
        elif isinstance(node.layer, Linear) and node.layer.bias:
            bn, last, activations = None, i, tuple(EPILOGUE_ACTIVATIONS)
        else:
            continue
        residual = None
        nxt = last + 1
        if only_reader(nxt, nodes[last].output) and isinstance(nodes[nxt].layer, Add) \
                and nodes[nxt].inputs[0] == nodes[last].output:
            last, residual = nxt, nodes[nxt].inputs[1]
        nxt = last + 1
        activation = "none"
        if only_reader(nxt, nodes[last].output) and isinstance(nodes[nxt].layer, Activation) \
                and nodes[nxt].layer.mode in activations:
            last, activation = nxt, EPILOGUE_ACTIVATIONS[nodes[nxt].layer.mode]
        found[i] = Fusion(i, bn, last, residual, activation)
    return found


def fold_batchnorm(weight: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   eps: float) -> tuple[np.ndarray, np.ndarray]:
    """An inference batch norm as y = x scale + shift: float32 scale and shift, from float64."""
    scale = np.asarray(weight, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    shift = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * scale
    return scale.astype(np.float32), shift.astype(np.float32)
