"""``kdb driver tensorop``: c = op(alpha1 * a, alpha2 * b) + beta * c, b broadcast (MIOpen's OpTensor)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.tensorop.problem import OPS, TensorOpProblem
from kdbkit.runtime.tensor import packed_strides, parse_dims

NUMPY_OPS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


class TensorOp(DriverSpec):
    command, label, log_label, primitive = "tensorop", "Tensor Op", "LogCmdTensorOp", "tensorop"
    summary = "Tensor operations add, mul, min, max with broadcasting, as MIOpen's OpTensor."
    example = "kdb driver tensorop --op mul -n 2 -c 8 -H 4 -W 4 --bshape 1x8x1x1 -t 1"
    directional = False
    flags = (
        Flag("op", ("--op",), str, "add", "Operation.", choices=OPS),
        Flag("bshape", ("--bshape",), str, None, "b's shape, e.g. 1x8x1x1: each size 1 (broadcast) or a's "
             "(default: a's shape)."),
        Flag("alpha1", ("-A", "--alpha1"), float, 1.0, "Alpha1: scales a."),
        Flag("alpha2", ("-B", "--alpha2"), float, 1.0, "Alpha2: scales b."),
        Flag("beta", ("--beta",), float, 0.0, "Beta: adds beta times c's old values."),
    )

    def problem(self, o, direction, dtype):
        bshape = parse_dims(o.bshape, "--bshape") if o.bshape else o.shape
        a = packed_strides(o.shape)
        return TensorOpProblem(o.op, dtype, o.shape, a, bshape, packed_strides(bshape), a, o.alpha1, o.alpha2, o.beta)

    def outputs(self, p):
        return ("c",)

    def reference(self, p, t):
        return {"c": NUMPY_OPS[p.op](p.alpha1 * t["a"], p.alpha2 * t["b"]) + p.beta * t["c"]}


SPEC = TensorOp()
