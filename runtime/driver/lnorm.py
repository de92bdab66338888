"""``kdb driver lnorm``: layer normalisation forward and backward (MIOpenDriver's layernorm)."""

from __future__ import annotations

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem
from kdbkit.runtime.reference import layernorm as ref


class LayerNorm(DriverSpec):
    command, label, log_label, primitive = "lnorm", "Layer Norm", "LogCmdLayerNorm", "layernorm"
    aliases = ("layernorm",)
    summary = "Layer normalisation forward and backward (dx, dweight, dbias), as MIOpenDriver layernorm."
    example = "kdb driver lnorm -n 2 -c 4 -H 4 -W 8 --dim 2 -t 1"
    flags = (
        Flag("dim", ("--dim",), int, -1, "First normalised dimension of N C H W (negative counts from the end)."),
        Flag("eps", ("--eps",), float, 1e-5, "Epsilon added to the variance."),
        Flag("affine", ("--affine",), int, 1, "With a weight and a bias: 1 yes, 0 no.", choices=(0, 1)),
    )

    def problem(self, o, direction, dtype):
        dim = o.dim + len(o.shape) if o.dim < 0 else o.dim
        return LayerNormProblem(direction, dtype, o.shape, dim, bool(o.affine), o.eps)

    def outputs(self, p):
        if p.direction == "fwd":
            return ("y", "mean", "rstd")
        return ("dx", "dweight", "dbias") if p.affine else ("dx",)

    def unused(self, p):
        if p.affine:
            return ()
        return ("weight", "bias") if p.direction == "fwd" else ("weight", "dweight", "dbias")

    def prepare(self, p, t):
        if p.direction == "bwd":  # mean and rstd are the forward's, of x
            _, mean, rstd = ref.forward(t["x"], dim=p.dim, eps=p.eps)
            t.set("mean", mean)
            t.set("rstd", rstd)

    def reference(self, p, t):
        affine = (t["weight"],) if p.affine else (None,)
        if p.direction == "fwd":
            y, mean, rstd = ref.forward(t["x"], *affine, t["bias"] if p.affine else None, dim=p.dim, eps=p.eps)
            return {"y": y, "mean": mean, "rstd": rstd}
        dx, dweight, dbias = ref.backward(t["x"], t["dy"], t["mean"], t["rstd"], *affine, dim=p.dim)
        return {"dx": dx, "dweight": dweight, "dbias": dbias}


SPEC = LayerNorm()
