"""``kdb driver softmax``: softmax and log-softmax forward and backward (MIOpenDriver's softmax)."""

from __future__ import annotations

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.softmax.problem import ALGORITHMS, MODES, SoftmaxProblem
from kdbkit.runtime.reference import softmax as ref
from kdbkit.runtime.tensor import packed_strides


class Softmax(DriverSpec):
    command, label, log_label, primitive = "softmax", "Softmax", "LogCmdSoftmax", "softmax"
    summary = "Softmax and log-softmax forward and backward, as MIOpenDriver softmax."
    example = "kdb driver softmax -n 2 -c 8 -H 4 -W 4 -a 2 -t 1"
    flags = (
        Flag("algo", ("-a", "--algorithm"), int, 1, "Algorithm: 0 fast, 1 accurate, 2 log.", choices=(0, 1, 2)),
        Flag("mode", ("-m", "--mode"), int, 1, "Mode: 0 instance (over C*H*W), 1 channel (over C).",
             choices=(0, 1)),
        Flag("alpha", ("-A", "--alpha"), float, 1.0, "Alpha: scales the result."),
        Flag("beta", ("-B", "--beta"), float, 0.0, "Beta: adds beta times the output's old values."),
    )

    def problem(self, o, direction, dtype):
        s = packed_strides(o.shape)
        return SoftmaxProblem(direction, ALGORITHMS[o.algo], MODES[o.mode], dtype, o.shape, s, s, o.alpha, o.beta)

    def outputs(self, p):
        return ("y",) if p.direction == "fwd" else ("dx",)

    def prepare(self, p, t):
        if p.direction == "bwd":  # y is a softmax output (of random logits)
            t.set("y", ref.forward(t["y"], p.algorithm, p.mode))

    def reference(self, p, t):
        if p.direction == "fwd":
            return {"y": p.alpha * ref.forward(t["x"], p.algorithm, p.mode) + p.beta * t["y"]}
        return {"dx": p.alpha * ref.backward(t["y"], t["dy"], p.algorithm, p.mode) + p.beta * t["dx"]}


SPEC = Softmax()
