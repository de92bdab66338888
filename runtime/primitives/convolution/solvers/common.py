"""What the convolution solvers share (the bias's and the epilogue's too): the shape and stride
arguments, the int-argument check."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.solver import APPLIES, not_applicable

INT_MAX = 2**31 - 1


def shape_args(problem: ConvProblem) -> list:
    """conv_shape.h's CONV_SHAPE_ARGS: the sizes, then x's, w's and y's strides."""
    n, c, h, w = problem.x_shape
    d = problem.descs()
    return [np.int32(v) for v in (n, c, h, w, problem.out_channels, *problem.out_hw, *problem.filter, *problem.pad,
                                  *problem.stride, *problem.dilation, problem.groups,
                                  *d["x"].strides, *d["w"].strides, *d["y"].strides)]


def fits_int_arguments(problem: Problem):
    """Each size and stride of the problem's tensors is an int argument; offsets are computed
    in 64 bits."""
    d = problem.tensors()
    if max(max(t.shape) for t in d.values()) > INT_MAX or max(max(t.strides) for t in d.values()) > INT_MAX:
        return not_applicable("sizes or strides exceed the kernel's int arguments")
    return APPLIES
