"""``kdb driver activ``: activation forward and backward (MIOpenDriver's activ)."""

from __future__ import annotations

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem
from kdbkit.runtime.reference import activation as ref
from kdbkit.runtime.tensor import packed_strides


class Activ(DriverSpec):
    command, label, log_label, primitive = "activ", "Activation", "LogCmdActivation", "activ"
    summary = "Activation forward and backward, as MIOpenDriver activ."
    example = "kdb driver activ -m gelu -n 2 -c 4 -H 8 -W 8 -t 1"
    flags = (
        Flag("mode", ("-m", "--mode"), str, "relu", "Mode, a name or MIOpen's number: "
             + ", ".join(f"{m.value} {m.label}" for m in ActivationMode) + "."),
        Flag("alpha", ("-A", "--alpha"), float, 1.0, "Alpha of the mode (tanh, power, clipped/leaky relu, elu)."),
        Flag("beta", ("-B", "--beta"), float, 1.0, "Beta of the mode (tanh, power)."),
        Flag("gamma", ("-G", "--gamma"), float, 1.0, "Gamma of the mode (power)."),
    )

    def problem(self, o, direction, dtype):
        s = packed_strides(o.shape)
        return ActivationProblem(direction, ActivationMode.parse(o.mode), dtype, o.shape, s, s, o.alpha, o.beta,
                                 o.gamma)

    def outputs(self, p):
        return ("y",) if p.direction == "fwd" else ("dx",)

    def prepare(self, p, t):
        if p.direction == "bwd":  # y is the forward's output of x
            t.set("y", ref.forward(t["x"], int(p.mode), p.alpha, p.beta, p.gamma))

    def reference(self, p, t):
        args = (int(p.mode), p.alpha, p.beta, p.gamma)
        if p.direction == "fwd":
            return {"y": ref.forward(t["x"], *args)}
        return {"dx": ref.backward(t["x"], t["y"], t["dy"], *args)}


SPEC = Activ()
