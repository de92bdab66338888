"""ConvImplicitGemmTensorCore (id 22): forward convolution of fp16/bf16 tensors as an
implicit GEMM on NVIDIA tensor cores (conv_igemm_tc.cu, mma.sync, sm_80+): output positions
by output channels, the reduction over the filter taps and 32 input channels at a time, x's
pixels staged straight from memory (zeros in the padding): no im2col. Input channels not a
multiple of 32 (a first layer's 3) take a kernel that gathers element by element. NHWC tensors go as they
are; NCHW ones are staged channels-last in a workspace (x, w and y, by conv_gemm.c's tiled
transposes)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solver, aligned16, fallback_invoker, not_applicable, register
from kdbkit.runtime.tensor import DataType

TILE, THREADS, STAGES, STEP, PAD = 128, 128, 4, 32, 8  # conv_igemm_tc.cu's IG_BM = IG_BN, IG_THREADS, ...
SHARED = STAGES * 2 * TILE * (STEP + PAD) * 2  # A's and B's padded tiles per stage, 2-byte elements


def program(problem: ConvProblem) -> ProgramRequest | None:
    if problem.dtype not in (DataType.FP16, DataType.BF16):
        return None
    return ProgramRequest("conv_igemm_tc.cu", problem.dtype.options)


@register
class ConvImplicitGemmTensorCore(Solver):
    id = 22
    name = "ConvImplicitGemmTensorCore"
    primitive = "conv"
    backends = ("cuda",)

    def is_applicable(self, problem: ConvProblem, device):
        arch = device.target.arch
        if device.backend != "cuda" or not arch[3:].rstrip("afs").isdigit() or int(arch[3:].rstrip("afs")) < 80:
            return not_applicable(f"it needs CUDA tensor cores with mma.sync (sm_80 or later; this is {arch})")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        if problem.out_channels % 2:
            return not_applicable(f"its output channels ({problem.out_channels}) must be even")
        n, c, h, w = problem.x_shape
        k = problem.out_channels
        if max(n * h * w * c, n * problem.out_hw[0] * problem.out_hw[1] * k, k * c * problem.filter[0]
               * problem.filter[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if problem.layout == "NCHW" and max(n, k) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image and per output channel, at most "
                                  "65535 of each")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        if problem.layout == "NHWC":
            return 0
        d = problem.descs()
        return sum(d[name].numel for name in ("x", "w", "y")) * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        request = program(problem)
        return [request, ProgramRequest("conv_gemm.c", problem.dtype.options)] if request else []

    def invoker(self, handle, problem: ConvProblem):
        request = program(problem)
        # 32 channels a step from one tap with cp.async, or (a first layer's 3 channels) element by element
        name = "conv_igemm_fwd_nhwc" if problem.x_shape[1] % STEP == 0 else "conv_igemm_fwd_nhwc_any"
        kernel = handle.program(request.kernel_file, request.options).function(name)
        n, _, _, _ = problem.x_shape
        positions = n * problem.out_hw[0] * problem.out_hw[1]
        grid = (-(-problem.out_channels // TILE), -(-positions // TILE), 1)
        fast = handle.backend.launcher(kernel, grid, (THREADS, 1, 1), [None, None, None, *shape_args(problem)],
                                       shared_bytes=SHARED)
        unaligned = fallback_invoker(handle, problem, "ConvIm2colGemm")  # a tensor not 16-byte aligned
        if problem.layout == "NHWC":
            def forward(x, w, y):
                (fast if aligned16(x, w, y) else unaligned)(x, w, y)

            return forward
        # NCHW: x and w staged channels-last, y computed channels-last and put back, each a batch
        # of matrix transposes (conv_gemm.c's conv_transpose).
        moves = handle.program("conv_gemm.c", problem.dtype.options).function("conv_transpose")
        backend, d = handle.backend, problem.descs()
        staged = {name: backend.alloc(d[name].numel * problem.dtype.itemsize) for name in ("x", "w", "y")}

        def transpose(matrices: int, rows: int, cols: int):
            grid = (-(-cols // 32), -(-rows // 32), matrices)
            return backend.launcher(moves, grid, (32, 8, 1), [None, None, np.int32(rows), np.int32(cols)])

        (n, c, h, w_), (k, _, fy, fx), (ho, wo) = problem.x_shape, problem.w_shape, problem.out_hw
        x_in, w_in, y_out = transpose(n, c, h * w_), transpose(k, c, fy * fx), transpose(n, ho * wo, k)

        def forward_nchw(x, w, y):
            x_in(x, staged["x"])
            w_in(w, staged["w"])
            fast(staged["x"], staged["w"], staged["y"])
            y_out(staged["y"], y)

        forward_nchw.workspace = tuple(staged.values())
        return forward_nchw
