"""``kdb driver pool``: 2-D max and average pooling forward and backward (MIOpenDriver's pool).

The argmax indices (int32, one per output) are passed as ``unused``, as ``pooling_forward`` and
``pooling_backward`` pass them: the invoker takes them, but they are not float values, so
KDB_CHECK_NUMERICS leaves them alone; forward's are compared with the reference's argmax
exactly (``exact``), ``y`` within the tolerance. Backward max pooling reads indices
prepared as the reference's argmax of dx's initial (random, seeded) values, as if its buffer
held the forward's x.
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.driver.spec import DriverSpec, Flag
from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
from kdbkit.runtime.reference import pooling as ref
from kdbkit.runtime.tensor import packed_strides


class Pool(DriverSpec):
    command, label, log_label, primitive = "pool", "Pooling", "LogCmdPooling", "pool"
    summary = "Max and average pooling forward and backward, as MIOpenDriver pool."
    example = "kdb driver pool -n 2 -c 4 -H 8 -W 8 -y 3 -x 3 -u 2 -v 2 -p 1 -q 1 -t 1"
    flags = (
        Flag("mode", ("-m", "--mode"), str, "max", "Mode: max, avg (padding not counted) or avg_in (padding "
             "counted).", choices=MODES),
        Flag("win_h", ("-y", "--win_h"), int, 2, "Window height.", minimum=1),
        Flag("win_w", ("-x", "--win_w"), int, 2, "Window width.", minimum=1),
        Flag("stride_h", ("-u", "--pool_stride_h"), int, 2, "Vertical stride.", minimum=1),
        Flag("stride_w", ("-v", "--pool_stride_w"), int, 2, "Horizontal stride.", minimum=1),
        Flag("pad_h", ("-p", "--pad_h"), int, 0, "Padding at the top and bottom (below the window height).",
             minimum=0),
        Flag("pad_w", ("-q", "--pad_w"), int, 0, "Padding left and right (below the window width).", minimum=0),
        Flag("input", ("--input",), str, None, "The input's shape as NxCxHxW (MIOpenDriver's newer pool flag), "
             "instead of -n -c -H -W."),
        Flag("indices", ("--indices",), int, 1, "Forward max pooling saves each output's argmax (the config's idx): "
             "1 yes, 0 no.", choices=(0, 1)),
    )

    def problem(self, o, direction, dtype):
        out = PoolProblem(direction, o.mode, dtype, o.shape, (o.win_h, o.win_w), (o.stride_h, o.stride_w),
                          (o.pad_h, o.pad_w), packed_strides(o.shape), packed_strides((*o.shape[:2], 1, 1)))
        # as pooling_forward and pooling_backward describe it: idx only where forward max saves indices
        keep = bool(o.indices) and o.mode == "max" if direction == "fwd" else True
        return PoolProblem(direction, o.mode, dtype, o.shape, out.window, out.stride, out.pad, out.x_strides,
                           packed_strides(out.out_shape), keep)

    def outputs(self, p):
        return ("y",) if p.direction == "fwd" else ("dx",)

    def unused(self, p):
        return ("indices",)  # int32, not float: see the module's docstring

    def exact(self, p, t):
        """Forward max pooling's argmax, where the problem saves it: the first maximum of each window."""
        if p.direction != "fwd" or p.mode != "max" or not p.indices:
            return {}
        return {"indices": np.ascontiguousarray(ref.forward(t["x"], "max", p.window, p.stride, p.pad)[1], np.int32)}

    def prepare(self, p, t):
        if p.direction == "bwd" and p.mode == "max":
            _, indices = ref.forward(t["dx"], "max", p.window, p.stride, p.pad)
            t.flat["indices"][...] = np.ascontiguousarray(indices, np.int32).ravel().view(np.float32)
            t.initial["indices"] = t.flat["indices"].copy()

    def reference(self, p, t):
        geometry = (p.mode, p.window, p.stride, p.pad)
        if p.direction == "fwd":
            return {"y": ref.forward(t["x"], *geometry)[0]}
        indices = t.flat["indices"].view(np.int32).reshape(p.out_shape) if p.mode == "max" else None
        return {"dx": ref.backward(t["dy"], p.shape, indices, *geometry)}


SPEC = Pool()
