"""The convolution problem: 2-D convolution of N x C x H x W by K x C/G x Y x X filters in G
groups, forward (F), backward data (B) or backward weights (W).

Its config string is MIOpen's problem serialisation, so find-db keys read like MIOpen's::

    64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F
    64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NHWC-NHWC-NHWC-FP16-B_g4

that is ``in C-H-W, filter YxX, out C-H-W, N, pad, stride, dilation, bias, layout(s), type,
direction``, then ``_g<G>`` where G > 1. As in MIOpen, "in" is x forward and dy backward
(data and weights), "out" y forward and x backward; the layout is written once when all three
tensors are NCHW, else for in, weights and out. Tensors are packed in their layout: NCHW
(weights KCYX) or NHWC (weights KYXC, PyTorch's channels-last); shapes are given N, C, H, W
whatever the layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import int_pair
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.tensor import DataType, TensorDesc, parse_int

DIRECTIONS = ("F", "B", "W")
LAYOUTS = ("NCHW", "NHWC")
TYPE_NAMES = {DataType.FP32: "FP32", DataType.FP16: "FP16", DataType.BF16: "BF16"}

_KEY = re.compile(r"^(\d+)-(\d+)-(\d+)-(\d+)x(\d+)-(\d+)-(\d+)-(\d+)-(\d+)-(\d+)x(\d+)-(\d+)x(\d+)-(\d+)x(\d+)-(\d+)-"
                  r"([A-Z]+(?:-[A-Z]+-[A-Z]+)?)-([A-Z0-9]+)-([FBW])(?:_g(\d+))?$")


def _pair(values, what: str) -> tuple[int, int]:
    return int_pair(values, what, "convolution")


def layout_strides(layout: str, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Element strides (for N, C, H, W) of a packed tensor of ``shape`` in ``layout``."""
    n, c, h, w = shape
    return (c * h * w, h * w, w, 1) if layout == "NCHW" else (h * w * c, 1, w * c, c)


def layouts_of(desc: TensorDesc) -> set[str]:
    """The layouts the 4-D tensor is packed in: none, one, or both (where size-1 dimensions make
    them the same, as with one channel)."""
    return {layout for layout in LAYOUTS if all(size == 1 or s == e for size, s, e in zip(
        desc.shape, desc.strides, layout_strides(layout, desc.shape)))}


@dataclass(frozen=True)
class ConvProblem(Problem):
    primitive = "conv"

    direction: str
    dtype: DataType
    layout: str
    x_shape: tuple[int, int, int, int]  # N, C, H, W
    out_channels: int  # K
    filter: tuple[int, int]  # Y, X
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ProblemError(f"convolution direction {self.direction!r}", "use F (forward), B (backward data) "
                               "or W (backward weights)")
        if self.layout not in LAYOUTS:
            raise ProblemError(f"convolution layout {self.layout!r}", f"use one of {', '.join(LAYOUTS)}")
        if len(self.x_shape) != 4 or min(self.x_shape) < 1:
            raise ProblemError(f"convolution input shape {self.x_shape}", "give N x C x H x W, every size >= 1")
        n, c, h, w = self.x_shape
        if self.out_channels < 1 or min(self.filter) < 1:
            raise ProblemError(f"convolution with {self.out_channels} output channels and a {self.filter} filter",
                               "output channels and filter sizes must be >= 1")
        if min(self.pad) < 0:
            raise ProblemError(f"convolution pad {self.pad} is negative", "pad each side by 0 or more")
        if min(self.stride) < 1 or min(self.dilation) < 1:
            raise ProblemError(f"convolution stride {self.stride}, dilation {self.dilation}",
                               "stride and dilation must be >= 1")
        if self.groups < 1 or c % self.groups or self.out_channels % self.groups:
            raise ProblemError(f"convolution groups={self.groups} with {c} input and {self.out_channels} output "
                               "channels", "both channel counts must be multiples of the group count")
        if min(self.out_hw) < 1:
            raise ProblemError(f"convolving a {h}x{w} plane with a {self.filter} filter (pad {self.pad}, stride "
                               f"{self.stride}, dilation {self.dilation}) leaves no output",
                               "use a smaller filter or dilation, or more padding")

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((size + 2 * p - d * (f - 1) - 1) // s + 1 for size, f, p, s, d in zip(
            self.x_shape[2:], self.filter, self.pad, self.stride, self.dilation))  # type: ignore[return-value]

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.x_shape[0], self.out_channels, *self.out_hw)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.x_shape[1] // self.groups, *self.filter)

    @property
    def flops(self) -> int:
        """Multiply-adds times two: the same for every direction."""
        n, k, ho, wo = self.y_shape
        return 2 * n * k * ho * wo * self.w_shape[1] * self.filter[0] * self.filter[1]

    def descs(self) -> dict[str, TensorDesc]:
        """x, w and y, packed in the layout."""
        return {name: TensorDesc(self.dtype, shape, layout_strides(self.layout, shape))
                for name, shape in (("x", self.x_shape), ("w", self.w_shape), ("y", self.y_shape))}

    def tensors(self) -> dict[str, TensorDesc]:
        d = self.descs()
        if self.direction == "F":
            return {"x": d["x"], "w": d["w"], "y": d["y"]}
        if self.direction == "B":
            return {"dy": d["y"], "w": d["w"], "dx": d["x"]}
        return {"dy": d["y"], "x": d["x"], "dw": d["w"]}

    def config(self) -> str:
        try:
            return self.__dict__["_config"]
        except KeyError:
            text = self.key()
            object.__setattr__(self, "_config", text)
            return text

    def key(self) -> str:
        """MIOpen's serialisation of this problem (see the module's docstring)."""
        n, c, h, w = self.x_shape
        k, (ho, wo) = self.out_channels, self.out_hw
        into, out = ((c, h, w), (k, ho, wo)) if self.direction == "F" else ((k, ho, wo), (c, h, w))
        layout = self.layout if self.layout == "NCHW" else "-".join([self.layout] * 3)
        text = (f"{into[0]}-{into[1]}-{into[2]}-{self.filter[0]}x{self.filter[1]}-{out[0]}-{out[1]}-{out[2]}-{n}-"
                f"{self.pad[0]}x{self.pad[1]}-{self.stride[0]}x{self.stride[1]}-{self.dilation[0]}x{self.dilation[1]}"
                f"-0-{layout}-{TYPE_NAMES[self.dtype]}-{self.direction}")
        return text + (f"_g{self.groups}" if self.groups != 1 else "")

    def fields(self) -> list[tuple[str, str]]:
        return [("key", self.key())]

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> "ConvProblem":
        if set(fields) != {"key"}:
            raise ProblemError(f"convolution fields {sorted(fields)}", "give a convolution as its MIOpen key")
        return cls.parse_key(fields["key"])

    @classmethod
    def parse_key(cls, text: str) -> "ConvProblem":
        """The problem a MIOpen convolution key names.

        Raises:
            ProblemError: not a 2-D key of this form, a bias, mixed layouts or types, or sizes
                that do not make a convolution (each named).
        """
        match = _KEY.match(text.strip())
        if match is None:
            raise ProblemError(f"convolution key {text!r} is not MIOpen's 2-D form",
                               "write it as e.g. 64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F")
        v = match.groups()
        sizes = (parse_int(x, "a size in the key") for x in v[:16])
        ic, ih, iw, fy, fx, oc, oh, ow, n, ph, pw, sh, sw, dh, dw, bias = sizes
        layouts, type_name, direction = v[16].split("-"), v[17], v[18]
        groups = parse_int(v[19] or "1", "the group count")
        if bias:
            raise ProblemError(f"convolution key {text!r} has a bias",
                               "write 0 there: the bias runs as a problem of its own (kdb driver conv -b 1, "
                               "kdbkit.convolution_bias_forward)")
        if len(set(layouts)) != 1 or layouts[0] not in LAYOUTS or (len(layouts) == 3 and layouts[0] == "NCHW"):
            raise ProblemError(f"convolution key {text!r}: layouts {'-'.join(layouts)}",
                               "use NCHW, or NHWC-NHWC-NHWC")
        dtype = next((t for t, name in TYPE_NAMES.items() if name == type_name), None)
        if dtype is None:
            raise ProblemError(f"convolution key {text!r}: type {type_name}", "use FP32, FP16 or BF16")
        (c, h, w), (k, ho, wo) = ((ic, ih, iw), (oc, oh, ow)) if direction == "F" else ((oc, oh, ow), (ic, ih, iw))
        problem = cls(direction, dtype, layouts[0], (n, c, h, w), k, (fy, fx), (ph, pw), (sh, sw), (dh, dw), groups)
        if problem.out_hw != (ho, wo):
            raise ProblemError(f"convolution key {text!r}: its output is {ho}x{wo}, but these sizes give "
                               f"{problem.out_hw[0]}x{problem.out_hw[1]}", "fix the output height and width")
        return problem


def catalogue() -> list:
    """One problem per compile-time specialisation (type, direction, grouped or not), the
    bias's and the epilogue's too."""
    from kdbkit.runtime.primitives.convolution.bias import catalogue as bias_catalogue
    from kdbkit.runtime.primitives.convolution.epilogue import catalogue as epilogue_catalogue

    # one-group problems in every direction, and a grouped forward (4 channels a group) for the
    # grouped kernels' programs
    return [ConvProblem(d, t, "NCHW", (1, 2, 4, 4), 2, (3, 3), (1, 1)) for t in DataType for d in DIRECTIONS] + \
        [ConvProblem("F", t, "NCHW", (1, 8, 4, 4), 8, (3, 3), (1, 1), groups=2) for t in DataType] + \
        bias_catalogue() + epilogue_catalogue()
