"""``kdb driver bnorm``: batch normalisation inference, training and backward (MIOpenDriver's bnorm).

MIOpenDriver's flags: ``-F 1`` training, ``-F 2`` inference, ``-F 0`` no forward; ``-b 1`` the
backward pass (run after the forward one when both are asked for; MIOpenDriver drops it);
``-m 0`` per-activation, ``1`` spatial; ``-s`` backward uses the saved mean and inverse std;
``-r`` training updates running statistics. A config's ``dir`` (infer, train, bwd) is the
direction, so ``-F`` beside ``--config`` must agree with it and ``-b`` cannot be given.

Problems are described as the batchnorm_* calls describe them (inference with the defaults
of the fields it does not use, training with saved statistics, backward with the default
factor and running), so the same work has the same config string, and find-db key.
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.reference import batchnorm as ref
from kdbkit.runtime.tensor import DataType, packed_strides

FORWARD = {1: "train", 2: "infer"}  # -F -> the forward direction
PHASES = {"infer": "Forward Inference", "train": "Forward Training", "bwd": "Backward"}


class BatchNorm(DriverSpec):
    command, label, log_label, primitive = "bnorm", "Batch Normalization", "LogCmdBatchNorm", "bnorm"
    summary = ("Batch normalisation training, inference and backward (dx, dscale, dbias), spatial or "
               "per-activation, as MIOpenDriver bnorm.")
    example = "kdb driver bnorm -n 2 -c 4 -H 4 -W 4 -F 1 -b 1 -t 1"
    directional = False  # its own -F: training or inference, and -b
    flags = (
        Flag("forw", ("-F", "--forw"), int, 1, "Forward pass: 1 training, 2 inference, 0 none (MIOpen's numbering; "
             "with --config, the config's own direction unless given: 1 train, 2 infer, 0 bwd).", choices=(0, 1, 2),
             problem=False),
        Flag("back", ("-b", "--back"), int, 0, "Backward pass: 1 yes (after the forward one), 0 no.", choices=(0, 1)),
        Flag("mode", ("-m", "--mode"), int, 1, "Mode: 0 per-activation (statistics per (c, h, w), over N), 1 spatial "
             "(per channel, over N*H*W).", choices=(0, 1)),
        Flag("save", ("-s", "--save"), int, 1, "Backward uses the mean and inverse std training saved: 1 yes, 0 no "
             "(computes them again).", choices=(0, 1)),
        Flag("run", ("-r", "--run"), int, 1, "Training updates the running mean and variance: 1 yes, 0 no.",
             choices=(0, 1)),
        Flag("eps", ("--eps",), float, 1e-5, "Epsilon added to the variance."),
        Flag("momentum", ("--momentum",), float, 0.1, "Running-average factor of training (the config's f)."),
    )

    def problem(self, o, direction, dtype):
        mode, s = ("per_act", "spatial")[o.mode], packed_strides(o.shape)
        if direction == "infer":
            return BatchNormProblem("infer", mode, dtype, o.shape, s, s, o.eps)
        if direction == "train":
            return BatchNormProblem("train", mode, dtype, o.shape, s, s, o.eps, o.momentum, bool(o.run))
        return BatchNormProblem("bwd", mode, dtype, o.shape, s, s, o.eps, saved=bool(o.save))

    def problems(self, o):
        directions = ([FORWARD[o.forw]] if o.forw else []) + (["bwd"] if o.back else [])
        if not directions:
            raise ValueError("-F 0 without -b 1 runs nothing; give -F 1 (training), -F 2 (inference) or -b 1")
        dtype = DataType.parse(o.dtype)
        return [self.problem(o, d, dtype) for d in directions]

    def config_problems(self, problem, forw):
        if forw is not None and forw != self.forw_of(problem):
            asked = FORWARD.get(forw, "bwd (no forward)")
            raise ValueError(f"the config is a {problem.direction} problem but -F {forw} asks for {asked}; "
                             f"give -F {self.forw_of(problem)} or leave -F out")
        return [problem]

    def forw_of(self, problem):
        return {"train": 1, "infer": 2, "bwd": 0}[problem.direction]

    def command_flags(self, problem):
        return f"-F {self.forw_of(problem)}" if problem.direction != "bwd" else ""

    def phase(self, problem):
        return PHASES[problem.direction]

    def outputs(self, p):
        if p.direction == "infer":
            return ("y",)
        if p.direction == "train":
            return ("y", "saved_mean", "saved_invstd") + (("running_mean", "running_var") if p.running else ())
        return ("dx", "dscale", "dbias")

    def unused(self, p):
        if p.direction == "train" and not p.running:
            return ("running_mean", "running_var")
        if p.direction == "bwd" and not p.saved:
            return ("saved_mean", "saved_invstd")
        return ()

    def prepare(self, p, t):
        if p.direction == "infer":  # a variance is positive
            t.set("var", np.abs(t["var"]) + 0.5)
        elif p.direction == "bwd" and p.saved:  # the statistics training saved, of x
            _, mean, invstd, _, _ = ref.training(t["x"], t["scale"], t["scale"], p.mode, p.eps)
            t.set("saved_mean", mean)
            t.set("saved_invstd", invstd)

    def reference(self, p, t):
        if p.direction == "infer":
            return {"y": ref.inference(t["x"], t["scale"], t["bias"], t["mean"], t["var"], p.mode, p.eps)}
        if p.direction == "train":
            running = (t["running_mean"], t["running_var"]) if p.running else (None, None)
            y, mean, invstd, new_mean, new_var = ref.training(t["x"], t["scale"], t["bias"], p.mode, p.eps, p.factor,
                                                              *running)
            return {"y": y, "saved_mean": mean, "saved_invstd": invstd, "running_mean": new_mean,
                    "running_var": new_var}
        dx, dscale, dbias = ref.backward(t["x"], t["dy"], t["scale"], p.mode, p.eps)
        return {"dx": dx, "dscale": dscale, "dbias": dbias}


SPEC = BatchNorm()
