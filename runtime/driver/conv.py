"""``kdb driver conv`` (and ``convfp16``, ``convbfp16``): 2-D convolution in its three
directions, with MIOpenDriver conv's flags.

``-F`` takes MIOpen's bits: 1 forward, 2 backward data, 4 backward weights, 0 all three.
``-k`` output channels, ``-y -x`` the filter, ``-p -q`` padding, ``-u -v`` stride, ``-l -j``
dilation, ``-g`` groups, ``-I -O -f`` the input, output and filter layouts (NCHW or NHWC, the
same for all three). ``-m`` takes only ``conv`` (no transposed convolution). ``-b 1`` adds the
bias as MIOpen's ConvolutionForwardBias and ConvolutionBackwardBias: y += bias per output
channel after a forward, db = the sum of dy with the backward directions, each run, timed and
verified as a problem of its own. With ``-t 1`` a ``stats:`` line follows each convolution's
time, as MIOpenDriver prints it: the layer, its sizes, FLOPs, bytes, GFLOP/s, GB/s and the time.
"""

from __future__ import annotations

import dataclasses

from kdbkit.runtime.driver.spec import COMMON, SHAPE, DriverSpec, Flag
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution.bias import ConvBiasProblem
from kdbkit.runtime.primitives.convolution.problem import LAYOUTS, ConvProblem
from kdbkit.runtime.reference import convolution as ref
from kdbkit.runtime.tensor import DataType

BITS = {"F": 1, "B": 2, "W": 4}  # -F's bit per direction
FORW = Flag("forw", ("-F", "--forw"), int, 0, "Directions, MIOpen's bits: 1 forward, 2 backward data, 4 backward "
            "weights (add them: 3, 5, 6); 0 all three (with --config, the config's own direction unless given).",
            choices=tuple(range(8)), problem=False)
TITLES = {"F": ("Forward Convolution", "Forward Conv."), "B": ("Backward Convolution Data", "Backward Data Conv."),
          "W": ("Backward Convolution Weights", "Backward Weights Conv."),
          "fwd": ("Forward Convolution Bias", "Forward Bias Conv."), "bwd": ("Backward Convolution Bias",
                                                                             "Backward Bias Conv.")}


class Conv(DriverSpec):
    command, label, log_label, primitive = "conv", "Convolution", "LogCmdConvolution", "conv"
    summary = "2-D convolution forward, backward data and backward weights, as MIOpenDriver conv."
    example = "kdb driver conv -n 2 -c 4 -H 9 -W 9 -k 6 -y 3 -x 3 -p 1 -q 1 -g 2 -t 1"
    flags = (
        Flag("k", ("-k", "--out_channels"), int, 8, "Output channels K.", minimum=1),
        Flag("fil_h", ("-y", "--fil_h"), int, 3, "Filter height.", minimum=1),
        Flag("fil_w", ("-x", "--fil_w"), int, 3, "Filter width.", minimum=1),
        Flag("pad_h", ("-p", "--pad_h"), int, 0, "Padding at the top and bottom.", minimum=0),
        Flag("pad_w", ("-q", "--pad_w"), int, 0, "Padding left and right.", minimum=0),
        Flag("stride_h", ("-u", "--conv_stride_h"), int, 1, "Vertical stride.", minimum=1),
        Flag("stride_w", ("-v", "--conv_stride_w"), int, 1, "Horizontal stride.", minimum=1),
        Flag("dilation_h", ("-l", "--dilation_h"), int, 1, "Vertical dilation.", minimum=1),
        Flag("dilation_w", ("-j", "--dilation_w"), int, 1, "Horizontal dilation.", minimum=1),
        Flag("groups", ("-g", "--group_count"), int, 1, "Groups (C and K both multiples of it; C for depthwise).",
             minimum=1),
        Flag("in_layout", ("-I", "--in_layout"), str, "NCHW", "Input layout.", choices=LAYOUTS),
        Flag("out_layout", ("-O", "--out_layout"), str, "NCHW", "Output layout.", choices=LAYOUTS),
        Flag("fil_layout", ("-f", "--fil_layout"), str, "NCHW", "Filter layout (NCHW: K C Y X; NHWC: K Y X C).",
             choices=LAYOUTS),
        Flag("mode", ("-m", "--mode"), str, "conv", "Convolution mode: conv (transposed convolution is not "
             "supported).", choices=("conv",)),
        Flag("bias", ("-b", "--bias"), int, 0, "Bias: 1 adds one per output channel after the forward and computes "
             "its gradient with the backward directions, each verified on its own.", choices=(0, 1)),
    )

    def all_flags(self):
        return (*SHAPE, *self.flags, FORW, *COMMON)

    def problem(self, o, direction, dtype):
        layouts = {o.in_layout, o.out_layout, o.fil_layout}
        if len(layouts) != 1:
            raise ProblemError(f"-I {o.in_layout}, -O {o.out_layout} and -f {o.fil_layout} differ",
                               "give the input, output and filter one layout")
        return ConvProblem(direction, dtype, o.in_layout, o.shape, o.k, (o.fil_h, o.fil_w), (o.pad_h, o.pad_w),
                           (o.stride_h, o.stride_w), (o.dilation_h, o.dilation_w), o.groups)

    def problems(self, o):
        dtype = DataType.parse(o.dtype)
        convolutions = [self.problem(o, d, dtype) for d, bit in BITS.items() if (o.forw or 7) & bit]
        if not o.bias:
            return convolutions
        y = dataclasses.replace(convolutions[0], direction="F").descs()["y"]  # the output, in its layout
        wanted = ["fwd"] * any(p.direction == "F" for p in convolutions) + \
            ["bwd"] * any(p.direction != "F" for p in convolutions)
        return [*convolutions, *(ConvBiasProblem(d, dtype, y.shape, y.strides) for d in wanted)]

    def config_problems(self, problem, forw):
        if forw is None:
            return [problem]
        return [dataclasses.replace(problem, direction=d) for d, bit in BITS.items() if (forw or 7) & bit]

    def forw_of(self, problem):
        return BITS.get(problem.direction, 1 if problem.direction == "fwd" else 6)

    def title(self, problem):
        return TITLES[problem.direction][0]

    def timing_title(self, problem):
        return TITLES[problem.direction][1]

    def stats(self, problem, ms):
        if isinstance(problem, ConvBiasProblem):
            return []
        n, c, h, w = problem.x_shape
        k, (ho, wo), (fy, fx) = problem.out_channels, problem.out_hw, problem.filter
        item = problem.dtype.itemsize
        sizes = {name: problem.descs()[name].numel * item for name in ("x", "w", "y")}
        read, written = {"F": (sizes["x"] + sizes["w"], sizes["y"]), "B": (sizes["y"] + sizes["w"], sizes["x"]),
                         "W": (sizes["y"] + sizes["x"], sizes["w"])}[problem.direction]
        name = f"{'fwd' if problem.direction == 'F' else 'bwd' if problem.direction == 'B' else 'wrw'}-" \
               f"conv{fy}x{fx}u{problem.stride[0]}"
        return ["stats: name, n, c, ho, wo, x, y, k, flopCnt, bytesRead, bytesWritten, GFLOPs, GB/s, timeMs",
                f"stats: {name}, {n}, {c}, {ho}, {wo}, {fx}, {fy}, {k}, {problem.flops}, {read}, {written}, "
                f"{problem.flops / ms / 1e6:.2f}, {(read + written) / ms / 1e6:.2f}, {ms:.6f}"]

    def outputs(self, p):
        return {"F": ("y",), "B": ("dx",), "W": ("dw",), "fwd": ("y",), "bwd": ("db",)}[p.direction]

    def reference(self, p, t):
        if isinstance(p, ConvBiasProblem):
            if p.direction == "fwd":
                return {"y": t["y"] + t["bias"][None, :, None, None]}
            return {"db": t["dy"].sum(axis=(0, 2, 3))}
        geometry = (p.pad, p.stride, p.dilation, p.groups)
        if p.direction == "F":
            return {"y": ref.forward(t["x"], t["w"], *geometry)}
        if p.direction == "B":
            return {"dx": ref.backward_data(t["dy"], t["w"], p.x_shape, *geometry)}
        return {"dw": ref.backward_weights(t["dy"], t["x"], p.w_shape, *geometry)}


SPEC = Conv()
