"""ConvIm2colGemm (id 21): each direction as a matrix multiply over the receptive fields
(conv_gemm.c lays them out; the multiply is whichever GEMM solver immediate mode picks, the
tensor-core ones on CUDA). With R = C x Y x X and P = Ho x Wo:

- NCHW forward: per image, y_n (K x P) = w (K x R) col_n (R x P), one batched multiply;
  backward data: col_n = w^T dy_n, then col2im; backward weights: dw (K x R) = dy' col^T with
  dy' the output gradient by channel (K x N P) and col (R x N P);
- NHWC forward: y (N P x K) = col (N P x R) w^T, one multiply, y NHWC as it comes out;
  backward data: col = dy w, then col2im; backward weights: dw (K x R) = dy^T col.

A 1 x 1 filter at stride 1 without padding needs no im2col where x itself is the column
matrix (forward; NHWC backward weights), nor a col2im (backward data). One group only; the
workspace holds the column matrix (and the regrouped gradient)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, fits_int_arguments, shape_args
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, launcher_1d, not_applicable

WORKSPACE_LIMIT = 4 << 30  # bytes; beyond it the solver does not apply


def program(problem: ConvProblem) -> ProgramRequest:
    return ProgramRequest("conv_gemm.c", problem.dtype.options)


def _sizes(problem: ConvProblem) -> tuple[int, int, int, int]:
    """N, K, R = C * Y * X, P = Ho * Wo."""
    n, c = problem.x_shape[:2]
    return n, problem.out_channels, c * problem.filter[0] * problem.filter[1], problem.out_hw[0] * problem.out_hw[1]


def _pointwise(problem: ConvProblem) -> bool:
    """x is its own column matrix: a 1 x 1 filter at stride 1, no padding."""
    return problem.filter == (1, 1) and problem.stride == (1, 1) and problem.pad == (0, 0)


def _needs_columns(problem: ConvProblem) -> bool:
    if not _pointwise(problem):
        return True
    return problem.direction == "W" and problem.layout == "NCHW"  # col is R x N P: x regrouped


def _workspace_elements(problem: ConvProblem) -> tuple[int, int]:
    """(column matrix, regrouped output gradient) elements."""
    n, k, r, p = _sizes(problem)
    col = n * r * p if _needs_columns(problem) else 0
    regrouped = k * n * p if problem.direction == "W" and problem.layout == "NCHW" else 0
    return col, regrouped


def _column_strides(problem: ConvProblem) -> list:
    """conv_gemm.c's (cn, cp, cc, ca, cb) for this direction and layout."""
    n, _, r, p = _sizes(problem)
    c, (y, x) = problem.x_shape[1], problem.filter
    if problem.layout == "NHWC":  # rows by position, columns (a, b, c) as KYXC weights
        strides = (p * r, r, 1, x * c, c)
    elif problem.direction == "W":  # R x (N P)
        strides = (p, 1, y * x * n * p, x * n * p, n * p)
    else:  # per image R x P
        strides = (r * p, 1, y * x * p, x * p, p)
    return [np.int64(s) for s in strides]


def _gemm(problem: ConvProblem) -> GemmProblem:
    """The multiply of the direction and layout (see the module's docstring)."""
    n, k, r, p = _sizes(problem)
    t = problem.dtype
    if problem.layout == "NCHW":
        if problem.direction == "F":
            return GemmProblem(t, k, p, r, batch=n, lda=r, ldb=p, ldc=p, stride_a=0, stride_b=r * p, stride_c=k * p)
        if problem.direction == "B":
            return GemmProblem(t, r, p, k, trans_a=True, batch=n, lda=r, ldb=p, ldc=p, stride_a=0, stride_b=k * p,
                               stride_c=r * p)
        return GemmProblem(t, k, r, n * p, trans_b=True, lda=n * p, ldb=n * p, ldc=r)
    if problem.direction == "F":
        return GemmProblem(t, n * p, k, r, trans_b=True, lda=r, ldb=r, ldc=k)
    if problem.direction == "B":
        return GemmProblem(t, n * p, r, k, lda=k, ldb=r, ldc=r)
    return GemmProblem(t, k, r, n * p, trans_a=True, lda=k, ldb=r, ldc=r)


class ConvIm2colGemm(Solver):
    id = 21
    name = "ConvIm2colGemm"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        n, k, r, p = _sizes(problem)
        if max(n * p, r, k) > INT_MAX:
            return not_applicable("its matrix sizes exceed the multiply's int arguments")
        if self.workspace(problem) > WORKSPACE_LIMIT:
            return not_applicable(f"its workspace of {self.workspace(problem) / 2**30:.1f} GiB exceeds "
                                  f"{WORKSPACE_LIMIT >> 30} GiB")
        return fits_int_arguments(problem)

    def workspace(self, problem: ConvProblem) -> int:
        return sum(_workspace_elements(problem)) * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        # The multiply's programs are the GEMM catalogue's: a bundle holds them already.
        return [program(problem)]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            args = shape_args(problem)
            gemm = _gemm(problem)
            multiply = context.invoker(gemm)  # immediate mode's choice of GEMM solver
            col_elements, regrouped_elements = _workspace_elements(problem)
            item = problem.dtype.itemsize
            col = context.alloc(col_elements * item) if col_elements else None
            regrouped = context.alloc(regrouped_elements * item) if regrouped_elements else None
            order, strides = np.int32(problem.layout == "NHWC"), _column_strides(problem)
            n, k, r, p = _sizes(problem)

            def kernel_1d(name: str, elements: int, tail: list):
                return launcher_1d(context, prog.function(name), elements, [None, None, *args, *tail],
                                   max_groups=1 << 16)

            im2col = kernel_1d("conv_im2col", n * r * p, [*strides, order]) if col is not None else None
            nchw = problem.layout == "NCHW"
            if problem.direction == "F":
                def forward(x, w, y):
                    fields = x
                    if im2col is not None:
                        im2col(x, col)
                        fields = col
                    multiply(a=w, b=fields, c=y) if nchw else multiply(a=fields, b=w, c=y)

                return forward
            if problem.direction == "B":
                col2im = kernel_1d("conv_col2im", int(np.prod(problem.x_shape)), [*strides, order])

                def backward_data(dy, w, dx):
                    product = dx if col is None else col  # a pointwise filter's product is dx itself
                    multiply(a=w, b=dy, c=product) if nchw else multiply(a=dy, b=w, c=product)
                    if col is not None:
                        col2im(col, dx)

                return backward_data
            regroup = kernel_1d("conv_dy_by_channel", k * n * p, []) if regrouped is not None else None

            def backward_weights(dy, x, dw):
                if im2col is not None:
                    im2col(x, col)
                if nchw:
                    regroup(dy, regrouped)
                    multiply(a=regrouped, b=col, c=dw)
                else:
                    multiply(a=dy, b=x if col is None else col, c=dw)

            return backward_weights

        return Solution(self.programs(problem), invoker_factory)
