"""A built network: a graph, its type and layout, parameters drawn from a seed, and four ways to
use it: the problems its forward asks kdbkit for, the forward itself on a device, and float64
NumPy and PyTorch references of the same parameters.

The forward allocates its device tensors once per handle (parameters, every value, scratch)
and reuses them on later calls: an elementwise layer writes over its input when nothing reads
that input later, and a value's buffer goes back to a pool, by size, after its last reader.
"""

from __future__ import annotations

import zlib
from functools import cached_property
from typing import Any

import numpy as np

from kdbkit.runtime.driver.tensors import to_storage
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.models.dry_run import DryRun
from kdbkit.runtime.models.fusion import Fusion, find_fusions, fold_batchnorm
from kdbkit.runtime.models.graph import Graph, Node, Site, value_desc
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc


def from_storage(stored: np.ndarray, dtype: DataType) -> np.ndarray:
    """The float values a type's storage holds (float32 for bf16, else the storage itself)."""
    if dtype is DataType.BF16:
        return (np.asarray(stored, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return stored


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: dict[str, Problem] = {}
    for problem in problems:
        seen.setdefault(problem.config(), problem)
    return list(seen.values())


class Network:
    """A network built for one input shape, type and layout; parameters drawn from ``seed``.

    Args:
        name: the model's name (``resnet18``, ...), for messages.
        graph: the layers, from the model's builder.
        dtype: ``fp32``, ``fp16`` or ``bf16``: the values' and the weights' type (batch norm's
            parameters stay float32, as kdbkit takes them).
        layout: ``NCHW`` or ``NHWC`` (channels-last) for the 4-D values and the convolution
            weights; networks without images take NCHW only.
        fuse: run each convolution, batch norm, residual addition and ReLU, and each linear
            layer, residual addition and activation, that :mod:`~kdbkit.runtime.models.fusion`
            finds as one fused call (the forward and its problems; the references stay layer by
            layer).

    Raises:
        ProblemError: a type or layout the network does not take.
    """

    def __init__(self, name: str, graph: Graph, *, dtype: str | DataType = "fp32", layout: str = "NCHW",
                 seed: int = 0, fuse: bool = True):
        if layout not in graph.layouts:
            raise ProblemError(f"{name} has no layout {layout!r}", f"use one of {', '.join(graph.layouts)}")
        self.name, self.graph, self.layout, self.seed = name, graph, layout, int(seed)
        self.fusions: dict[int, Fusion] = find_fusions(graph) if fuse else {}
        self.dtype = DataType.parse(dtype)
        self.descs = {v: value_desc(self.dtype, shape, layout) for v, shape in graph.shapes.items()}
        self._specs = graph.param_specs()
        self._node_params: list[dict[str, str]] = [{} for _ in graph.nodes]
        index = {id(node): i for i, node in enumerate(graph.nodes)}
        for full, (node, own, _) in self._specs.items():
            self._node_params[index[id(node)]][own] = full
        self._device: _DeviceState | None = None

    def __repr__(self) -> str:
        return (f"Network({self.name}, input {'x'.join(map(str, self.input_shape))}, {self.dtype.label}, "
                f"{self.layout}, {len(self.graph.nodes)} layers)")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.graph.shapes[self.graph.input]

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.graph.shapes[self.graph.output]

    # -- parameters ---------------------------------------------------------------------------

    @cached_property
    def params(self) -> dict[str, np.ndarray]:
        """Every parameter in float64, by its PyTorch state-dict name. Each is drawn from its
        own generator (the seed and the name), so it does not depend on the batch or on which
        other parameters exist."""
        return {full: param.init(np.random.default_rng([self.seed, zlib.crc32(full.encode())]), param.shape)
                for full, (_, _, param) in self._specs.items()}

    def param_type(self, full: str) -> DataType:
        """The type a parameter is held in on the device."""
        return DataType.FP32 if self._specs[full][2].float32 else self.dtype

    @cached_property
    def held_params(self) -> dict[str, np.ndarray]:
        """The parameters as the device holds them (rounded to their type), in float64: what
        the references compute with, so that they differ from the forward only by its arithmetic."""
        return {full: from_storage(to_storage(value, self.param_type(full)), self.param_type(full)).astype(np.float64)
                for full, value in self.params.items()}

    def _param_desc(self, full: str) -> TensorDesc:
        node, own, param = self._specs[full]
        return node.layer.param_desc(own, param, self.dtype, self.layout, self.graph.in_shapes(node))

    def _sites(self, values: dict[str, DeviceTensor], params: dict[str, DeviceTensor],
               scratch: list[dict[str, DeviceTensor]]) -> list[tuple[Node, Site]]:
        return [(node, Site([values[v] for v in node.inputs], values[node.output],
                            {own: params[full] for own, full in self._node_params[i].items()}, scratch[i]))
                for i, node in enumerate(self.graph.nodes)]

    def _scratch_descs(self) -> list[dict[str, TensorDesc]]:
        descs = []
        for node in self.graph.nodes:
            shapes = self.graph.in_shapes(node)
            made = {name: TensorDesc.packed(DataType.FP32, shape or (1,)) for name, shape in node.layer.scratch(*shapes).items()}
            made.update((name, TensorDesc.packed(self.dtype, shape)) for name, shape in node.layer.work(*shapes).items())
            descs.append(made)
        return descs

    # -- the problems -------------------------------------------------------------------------

    def problems(self) -> list[Problem]:
        """Every problem the forward asks kdbkit's solvers for, each once, in the order of first use.

        No device and no parameter values are needed: the layers' calls run against a
        :class:`~kdbkit.runtime.models.dry_run.DryRun`.
        """
        described = {v: DeviceTensor(None, desc) for v, desc in self.descs.items()}  # type: ignore[arg-type]
        params = {full: DeviceTensor(None, self._param_desc(full)) for full in self._specs}  # type: ignore[arg-type]
        scratch = [{n: DeviceTensor(None, d) for n, d in s.items()} for s in self._scratch_descs()]  # type: ignore
        dry = DryRun()
        folded = {}
        for i, fusion in self.fusions.items():
            layer = self.graph.nodes[i].layer
            vector = DeviceTensor(None, TensorDesc.packed(DataType.FP32, (layer.out_features if fusion.linear
                                                                          else layer.k,)))  # type: ignore[arg-type]
            folded[i] = (None if fusion.linear else vector, vector)
        self._run_layers(dry, None, described, self._sites(described, params, scratch), folded)
        return _dedupe(dry.problems)

    def folded(self, i: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Fusion ``i``'s per-channel float32 (scale, shift), from the parameters as held: its
        batch norm folded, or a linear layer's bias as the shift (and no scale)."""
        fusion = self.fusions[i]
        if fusion.linear:
            bias = self.held_params[self._node_params[i]["bias"]]
            return None, bias.astype(np.float32)
        p = {own: self.held_params[full] for own, full in self._node_params[fusion.bn].items()}
        return fold_batchnorm(p["weight"], p["bias"], p["running_mean"], p["running_var"],
                              self.graph.nodes[fusion.bn].layer.eps)

    def _run_layers(self, k, handle, values: dict[str, DeviceTensor], sites: list[tuple[Node, Site]],
                    folded: dict[int, tuple[DeviceTensor | None, DeviceTensor]]) -> None:
        """Every layer's calls on ``k``, a fusion's layers as one fused call (unless its output
        shares the buffer of the residual or of the first layer's input, which the call would
        overwrite before reading)."""
        i = 0
        while i < len(sites):
            node, site = sites[i]
            fusion = self.fusions.get(i)
            if fusion is not None:
                out = sites[fusion.last][1].out
                residual = values[fusion.residual] if fusion.residual is not None else None
                if out.buffer is None or all(t.buffer is not out.buffer for t in (site.ins[0], residual) if t is not None):
                    node.layer.run_fused(k, handle, site, out, *folded[i], residual, fusion.activation)
                    i = fusion.last + 1
                    continue
            node.layer.run(k, handle, site)
            i += 1

    # -- the forward through kdbkit -----------------------------------------------------------

    def forward(self, handle, x: Any) -> Any:
        """Run the network through kdbkit on ``handle``'s device.

        Args:
            x: a NumPy array of :attr:`input_shape` (images N x C x H x W, whatever the layout;
                it is converted to the network's type and layout), or a
                :class:`~kdbkit.runtime.tensor.DeviceTensor` already in that type and layout.

        Returns:
            For a NumPy input, the output as a NumPy array in the network's type (float32 for
            bf16); for a device tensor, the network's own output tensor on the device, which
            the next forward overwrites.

        Raises:
            ProblemError: an input of another shape, type or layout.
        """
        import kdbkit

        self.to_device(handle)
        state = self._device
        want = self.descs[self.graph.input]
        uploaded = None
        if isinstance(x, DeviceTensor):
            if x.desc != want:
                raise ProblemError(f"{self.name}'s input is {x.desc.dtype.label} {x.desc.shape} strides "
                                   f"{x.desc.strides}; it takes {want.dtype.label} {want.shape} strides {want.strides}",
                                   f"pass a {self.layout} {want.dtype.label} tensor of that shape, or a NumPy array")
            given = x
        else:
            given = self.input_tensor(handle, x)
            uploaded = given.buffer
        try:
            values = dict(state.values)
            values[self.graph.input] = given
            self._run_layers(kdbkit, handle, values, self._sites(values, state.params, state.scratch), state.folded)
            out = values[self.graph.output]
            if uploaded is None:
                return out
            return self._download(handle.backend, out)
        finally:
            if uploaded is not None:
                uploaded.free()

    def to_device(self, handle) -> None:
        """Upload the parameters and allocate every value and scratch tensor for ``handle`` now,
        as a framework's ``model.to(device)`` does, so that the next forward only runs layers."""
        if self._device is None or self._device.handle is not handle:
            self.release()
            self._device = _DeviceState(self, handle)

    def input_tensor(self, handle, x: np.ndarray) -> DeviceTensor:
        """``x`` (N x C x H x W images, or BERT's hidden states) on ``handle``'s device in the
        network's type and layout: an input :meth:`forward` takes as it is. The caller frees its buffer."""
        want = self.descs[self.graph.input]
        x = np.asarray(x)
        if tuple(x.shape) != want.shape:
            raise ProblemError(f"{self.name}'s input is {x.shape}; it takes {want.shape}",
                               "pass an input of the shape the network was built for")
        memory = x.transpose(0, 2, 3, 1) if len(want.shape) == 4 and self.layout == "NHWC" else x
        return DeviceTensor(handle.backend.to_device(np.ascontiguousarray(to_storage(memory, self.dtype))), want)

    def download(self, handle, t: DeviceTensor) -> np.ndarray:
        """A device output of :meth:`forward` as NumPy (N x C x H x W whatever the layout)."""
        return self._download(handle.backend, t)

    def _download(self, backend, t: DeviceTensor) -> np.ndarray:
        shape = t.desc.shape
        nhwc = len(shape) == 4 and not t.desc.is_packed
        memory_shape = (shape[0], shape[2], shape[3], shape[1]) if nhwc else shape
        host = backend.to_host(t.buffer, np.empty(memory_shape, self.dtype.storage))
        host = from_storage(host, self.dtype)
        return np.ascontiguousarray(host.transpose(0, 3, 1, 2)) if nhwc else host

    def release(self) -> None:
        """Free the device tensors the last forward's handle holds (a later forward makes them again)."""
        if self._device is not None:
            self._device.free()
            self._device = None

    # -- references ---------------------------------------------------------------------------

    def reference_forward(self, x: np.ndarray) -> np.ndarray:
        """The same network in float64 NumPy with :attr:`held_params`; images N x C x H x W."""
        values = {self.graph.input: np.asarray(x, np.float64)}
        last = self.graph.last_reads()
        for i, node in enumerate(self.graph.nodes):
            p = {own: self.held_params[full] for own, full in self._node_params[i].items()}
            values[node.output] = node.layer.reference(p, *(values[v] for v in node.inputs))
            for v in node.inputs:
                if last[v] == i:
                    values.pop(v, None)
        return values[self.graph.output]

    def torch_forward(self, x: np.ndarray, device: str = "cuda") -> np.ndarray:
        """The same network with PyTorch on ``device``, in the network's type and layout
        (channels-last memory for NHWC), with :attr:`held_params`; TF32 is off for the call.

        Returns:
            The output as a float64 NumPy array.

        Raises:
            ImportError: PyTorch is not installed.
        """
        forward, to_input = self.torch_callable(device)
        return forward(to_input(x)).double().cpu().numpy()

    def torch_callable(self, device: str = "cuda"):
        """PyTorch eager's version of the network with its parameters already on ``device``:
        ``(forward, to_input)``, where ``to_input(x)`` puts a NumPy input on the device in the
        network's type and layout and ``forward(t)`` runs every layer (TF32 off, inference mode).

        Raises:
            ImportError: PyTorch is not installed.
        """
        import torch

        types = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}
        channels_last = self.layout == "NHWC"

        def tensor(value: np.ndarray, dtype: DataType):
            t = torch.from_numpy(np.ascontiguousarray(value)).to(device=device, dtype=types[dtype])
            return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

        params = {full: tensor(value, self.param_type(full)) for full, value in self.held_params.items()}

        def forward(x):
            flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            try:
                with torch.inference_mode():
                    values = {self.graph.input: x}
                    for i, node in enumerate(self.graph.nodes):
                        p = {own: params[full] for own, full in self._node_params[i].items()}
                        values[node.output] = node.layer.torch(p, *(values[v] for v in node.inputs))
                    return values[self.graph.output]
            finally:
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags

        return forward, lambda x: tensor(np.asarray(x, np.float64), self.dtype)


class _DeviceState:
    """One handle's device tensors for a network: parameters, values (buffers shared as the
    module's docstring says; the input is the caller's, per call) and scratch."""

    def __init__(self, net: Network, handle):
        self.handle = handle
        backend = handle.backend
        self._owned = []
        try:
            self.params = {}
            for full in net._specs:
                node, own, _ = net._specs[full]
                desc = net._param_desc(full)
                memory = node.layer.param_memory(own, net.params[full], net.layout, net.graph.in_shapes(node))
                buffer = backend.to_device(np.ascontiguousarray(to_storage(memory, desc.dtype)))
                self._owned.append(buffer)
                self.params[full] = DeviceTensor(buffer, desc)
            self.folded = {}
            for i in net.fusions:
                made = []
                for values in net.folded(i):
                    if values is None:  # a linear layer's: no scale
                        made.append(None)
                        continue
                    buffer = backend.to_device(values)
                    self._owned.append(buffer)
                    made.append(DeviceTensor(buffer, TensorDesc.packed(DataType.FP32, values.shape)))
                self.folded[i] = tuple(made)
            slots = self._slots(net)
            buffers = {}
            for slot in sorted(set(slots.values())):
                buffers[slot] = backend.alloc(slot[1])
                self._owned.append(buffers[slot])
            self.values = {v: DeviceTensor(buffers[slots[v]], net.descs[v]) for v in slots}
            self.scratch = []
            shared: dict[int, object] = {}  # work tensors live only while their layer runs: one buffer per size
            for node, descs in zip(net.graph.nodes, net._scratch_descs()):
                work = node.layer.work(*net.graph.in_shapes(node))
                made = {}
                for name, desc in descs.items():
                    if name in work and desc.nbytes in shared:
                        buffer = shared[desc.nbytes]
                    else:
                        buffer = backend.alloc(desc.nbytes)
                        self._owned.append(buffer)
                        if name in work:
                            shared[desc.nbytes] = buffer
                    made[name] = DeviceTensor(buffer, desc)
                self.scratch.append(made)
        except BaseException:
            self.free()
            raise

    @staticmethod
    def _slots(net: Network) -> dict[str, tuple[int, int]]:
        """(slot, bytes) per value but the input: in place where a layer allows and its input
        dies there, else a free slot of the same size, else a new one."""
        graph, last = net.graph, net.graph.last_reads()
        size = {v: d.nbytes for v, d in net.descs.items()}
        slots: dict[str, tuple[int, int]] = {}
        free: dict[int, list[tuple[int, int]]] = {}
        made = 0
        for i, node in enumerate(graph.nodes):
            first = node.inputs[0] if node.inputs else None
            if (node.layer.inplace and first in slots and last[first] == i and size[first] == size[node.output]
                    and node.inputs.count(first) == 1):
                slot = slots[first]
            elif free.get(size[node.output]):
                slot = free[size[node.output]].pop()
            else:
                slot, made = (made, size[node.output]), made + 1
            slots[node.output] = slot
            for v in set(node.inputs):
                if v in slots and last[v] == i and slots[v] != slot:
                    free.setdefault(size[v], []).append(slots[v])
        return slots

    def free(self) -> None:
        for buffer in self._owned:
            buffer.free()
        self._owned = []
