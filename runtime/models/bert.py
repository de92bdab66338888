"""BERT-base's encoder layers (hidden 768, 12 heads, intermediate 3072; post-norm, GELU with
erf), for inference on hidden states of ``batch`` x ``seq`` x ``hidden``, without a mask.
Parameter names are Hugging Face's ``BertEncoder`` state-dict keys (``encoder.layer.0.attention
.self.query.weight``, ...).

How attention maps onto kdbkit (T = batch * seq tokens, d = hidden / heads):

* Q, K and V are each one gemm, the tokens (T x hidden) times the weight (transposed), into
  a work tensor of T x hidden, then one op_tensor that adds the bias (broadcast over the
  tokens) and writes the sum split into heads, ``heads`` x T x d, so that each head's rows lie
  together. One T x hidden gemm takes the tensor-core solvers' large tiles (wgmma on sm_90),
  where ``heads`` gemms of T x d each are too narrow for them and cost a launch apiece.
* heads x T x d is also (heads * batch) x seq x d: one batched gemm gives every head's scores
  (the 1 / sqrt(d) scale as the gemm's alpha), a softmax over the rows' last dimension the
  probabilities, one more batched gemm the context.
* The context goes back to T x hidden (the heads side by side) through an op_tensor over a
  strided view of it: ``max(a, a)`` is an exact copy, and kdbkit has no copy or transpose
  primitive. Then the output projection, residual addition and layer norm; the feed-forward
  (gemm, GELU, gemm) with its residual addition and layer norm.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.models.graph import Graph, Layer, Param, Shape, Site, normal, view
from kdbkit.runtime.models.layers import Activation, Add, LayerNorm, Linear, Softmax


def _matrices(t, count: int, rows: int, cols: int):
    """``count`` packed rows x cols matrices as kdbkit's gemm takes them (2-D when only one)."""
    return view(t, (count, rows, cols) if count > 1 else (rows, cols))


class HeadsProjection(Layer):
    """A linear layer (hidden -> hidden) whose output is split into heads: batch x seq x hidden
    in, heads x T x d out. The weight is PyTorch's (out x in), its rows taken head by head."""

    def __init__(self, heads: int):
        self.heads = heads

    def out_shape(self, x: Shape) -> Shape:
        b, s, hidden = x
        return (self.heads, b * s, hidden // self.heads)

    def params(self, x: Shape) -> dict[str, Param]:
        hidden = x[-1]
        return {"weight": Param((hidden, hidden), normal(math.sqrt(1.0 / hidden))),
                "bias": Param((hidden,), normal(0.05))}

    def work(self, x: Shape) -> dict[str, Shape]:
        b, s, hidden = x
        return {"projected": (b * s, hidden)}

    def run(self, k, handle, site: Site) -> None:
        heads, tokens, d = site.out.desc.shape
        projected = site.scratch["projected"]
        k.gemm(handle, view(site.ins[0], (tokens, heads * d)), site.params["weight"], trans_b=True, c=projected)
        # token-major (T, heads, d) in, head-major out: the same index order, the output's strides permuted
        k.op_tensor(handle, "add", view(projected, (tokens, heads, d)), view(site.params["bias"], (1, heads, d)),
                    c=view(site.out, (tokens, heads, d), (d, tokens * d, 1)))

    def reference(self, p, x) -> np.ndarray:
        b, s, hidden = x.shape
        y = x.reshape(b * s, hidden) @ p["weight"].T + p["bias"]
        return y.reshape(b * s, self.heads, hidden // self.heads).transpose(1, 0, 2)

    def torch(self, p, x) -> Any:
        import torch.nn.functional as F

        b, s, hidden = x.shape
        y = F.linear(x.reshape(b * s, hidden), p["weight"], p["bias"])
        return y.reshape(b * s, self.heads, hidden // self.heads).transpose(0, 1).contiguous()


class AttentionScores(Layer):
    """Q K^T / sqrt(d) for every (head, sequence): (heads * batch) x seq x seq."""

    def __init__(self, batch: int, seq: int):
        self.batch, self.seq = batch, seq

    def out_shape(self, q: Shape, k: Shape) -> Shape:
        return (q[0] * self.batch, self.seq, self.seq)

    def run(self, k, handle, site: Site) -> None:
        q, key = site.ins
        heads, _, d = q.desc.shape
        count = heads * self.batch
        k.gemm(handle, _matrices(q, count, self.seq, d), _matrices(key, count, self.seq, d), trans_b=True,
               alpha=1.0 / math.sqrt(d), c=_matrices(site.out, count, self.seq, self.seq))

    def reference(self, p, q, key) -> np.ndarray:
        heads, _, d = q.shape
        q, key = (t.reshape(heads * self.batch, self.seq, d) for t in (q, key))
        return q @ key.transpose(0, 2, 1) / math.sqrt(d)

    def torch(self, p, q, key) -> Any:
        heads, _, d = q.shape
        q, key = (t.reshape(heads * self.batch, self.seq, d) for t in (q, key))
        return (q @ key.transpose(1, 2)) / math.sqrt(d)


class AttentionContext(Layer):
    """The probabilities times V: heads x T x d (the layout Q, K and V have)."""

    def __init__(self, batch: int, seq: int):
        self.batch, self.seq = batch, seq

    def out_shape(self, probs: Shape, v: Shape) -> Shape:
        return v

    def run(self, k, handle, site: Site) -> None:
        probs, v = site.ins
        heads, _, d = v.desc.shape
        count = heads * self.batch
        k.gemm(handle, _matrices(probs, count, self.seq, self.seq), _matrices(v, count, self.seq, d),
               c=_matrices(site.out, count, self.seq, d))

    def reference(self, p, probs, v) -> np.ndarray:
        return (probs @ v.reshape(probs.shape[0], self.seq, -1)).reshape(v.shape)

    def torch(self, p, probs, v) -> Any:
        return (probs @ v.reshape(probs.shape[0], self.seq, -1)).reshape(v.shape)


class MergeHeads(Layer):
    """heads x T x d -> batch x seq x hidden, each token's heads side by side: an exact copy
    through op_tensor (``max(a, a)``) from a strided view of the heads."""

    def __init__(self, batch: int, seq: int):
        self.batch, self.seq = batch, seq

    def out_shape(self, x: Shape) -> Shape:
        heads, tokens, d = x
        return (self.batch, self.seq, heads * d)

    def run(self, k, handle, site: Site) -> None:
        heads, tokens, d = site.ins[0].desc.shape
        shape = (self.batch, self.seq, heads, d)
        a = view(site.ins[0], shape, (self.seq * d, d, tokens * d, 1))
        k.op_tensor(handle, "max", a, a, c=view(site.out, shape))

    def reference(self, p, x) -> np.ndarray:
        heads, tokens, d = x.shape
        return x.transpose(1, 0, 2).reshape(self.batch, self.seq, heads * d)

    def torch(self, p, x) -> Any:
        heads, tokens, d = x.shape
        return x.transpose(0, 1).reshape(self.batch, self.seq, heads * d)


def bert_base(*, batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12, intermediate: int = 3072,
              layers: int = 12, eps: float = 1e-12) -> Graph:
    """``layers`` BERT encoder layers on hidden states of ``batch`` x ``seq`` x ``hidden``.

    Raises:
        ProblemError: ``hidden`` not a multiple of ``heads``.
    """
    if hidden % heads:
        raise ProblemError(f"BERT with hidden size {hidden} and {heads} heads", "hidden must be a multiple of heads")
    g = Graph((batch, seq, hidden), layouts=("NCHW",))
    x = g.input
    for i in range(layers):
        name = f"encoder.layer.{i}"
        q, key, v = (g.add(HeadsProjection(heads), x, name=f"{name}.attention.self.{part}")
                     for part in ("query", "key", "value"))
        probs = g.add(Softmax(), g.add(AttentionScores(batch, seq), q, key))
        context = g.add(MergeHeads(batch, seq), g.add(AttentionContext(batch, seq), probs, v))
        attended = g.add(Add(), g.add(Linear(hidden), context, name=f"{name}.attention.output.dense"), x)
        attended = g.add(LayerNorm(eps=eps), attended, name=f"{name}.attention.output.LayerNorm")
        inner = g.add(Activation("gelu_erf"), g.add(Linear(intermediate), attended, name=f"{name}.intermediate.dense"))
        out = g.add(Add(), g.add(Linear(hidden), inner, name=f"{name}.output.dense"), attended)
        x = g.add(LayerNorm(eps=eps), out, name=f"{name}.output.LayerNorm")
    return g
