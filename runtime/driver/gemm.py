"""``kdb driver gemm``: C = alpha * op(A) op(B) + beta * C, batched, row-major (MIOpenDriver's gemm).

MIOpenDriver's flags: ``-m`` (A's height), ``-k`` (A's width), ``-n`` (B's width), ``-u`` and
``-v`` transpose A and B, ``-A`` alpha, ``-B`` beta, ``-b`` batch count. The operands are
packed, as ``gemm`` describes packed arrays (a batch stride only with more than one matrix);
``--config`` runs strided ones. No direction: no ``-F``, and no ``-n -c -H -W``.
"""

from __future__ import annotations

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.reference.gemm import gemm as ref


class Gemm(DriverSpec):
    command, label, log_label, primitive = "gemm", "GEMM", "LogCmdGemm", "gemm"
    summary = "Matrix multiply C = alpha * op(A) op(B) + beta * C, batched, as MIOpenDriver gemm."
    example = "kdb driver gemm -m 32 -n 16 -k 24 -u 1 -b 2 -B 0.5 -t 1"
    shape_flags = False  # -m -n -k
    directional = False
    flags = (
        Flag("m", ("-m", "--a_h"), int, 64, "M: rows of op(A) and C.", minimum=1),
        Flag("n", ("-n", "--b_w"), int, 64, "N: columns of op(B) and C.", minimum=1),
        Flag("k", ("-k", "--a_w"), int, 64, "K: columns of op(A), rows of op(B).", minimum=1),
        Flag("trans_a", ("-u", "--transA"), int, 0, "Transpose A (stored K x M): 1 yes, 0 no.", choices=(0, 1)),
        Flag("trans_b", ("-v", "--transB"), int, 0, "Transpose B (stored N x K): 1 yes, 0 no.", choices=(0, 1)),
        Flag("batch", ("-b", "--batch_count"), int, 1, "Matrices in the batch.", minimum=1),
        Flag("alpha", ("-A", "--alpha"), float, 1.0, "Alpha: scales op(A) op(B)."),
        Flag("beta", ("-B", "--beta"), float, 0.0, "Beta: adds beta times C's old values."),
    )

    def problem(self, o, direction, dtype):
        lda = o.m if o.trans_a else o.k
        ldb = o.k if o.trans_b else o.n
        batched = o.batch > 1
        return GemmProblem(dtype, o.m, o.n, o.k, bool(o.trans_a), bool(o.trans_b), o.batch, lda, ldb, o.n,
                           o.m * o.k if batched else 0, o.k * o.n if batched else 0, o.m * o.n if batched else 0,
                           o.alpha, o.beta)

    def outputs(self, p):
        return ("c",)

    def reference(self, p, t):
        return {"c": ref(t["a"], t["b"], p.trans_a, p.trans_b, p.alpha, p.beta, t["c"])}


SPEC = Gemm()
