"""The convolution layers scripts/bench_conv.py measures: whole models at batch 32 (each layer
with how often the model runs it) and a set of distinct problems from real networks.

Shapes follow torchvision's models (ResNet v1.5: the stride on the 3 x 3 convolution; ResNeXt's
bottleneck width ``planes * width_per_group / 64 * groups``; Inception-v3 without padding on its
stem; DeepLab-v3's ResNet-101 with layer3 and layer4 dilated instead of strided), the original
U-Net (unpadded 3 x 3 convolutions on a 572 x 572 image) and YOLOv3's Darknet-53 at 416 x 416.
Only the convolutions are listed (pooling, the transposed convolutions of U-Net's decoder and the
upsampling of YOLO's head change sizes between them).

No PyTorch or GPU here: the lists are plain data, tested on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BATCH = 32  # the models' batch
# The set's batches, spread from 1 to 256 (powers of two and the sizes between); problem i of
# network j takes entry (5 j + i) mod 16, before the memory cap below.
SET_BATCHES = (1, 256, 16, 2, 128, 32, 4, 64, 8, 192, 24, 3, 96, 12, 48, 6)
# Each set problem's batch is halved until x and y together hold at most this many elements
# (1 GiB in fp32): with the gradients (dx, dy) and the weights a direction's tensors stay under
# 2.5 GiB in fp32, far inside an 80 GB card beside cuDNN's workspace, and no problem runs long.
SET_ELEMENTS_CAP = 1 << 28


@dataclass(frozen=True)
class Conv:
    """One convolution layer: N x C x H x W input, K filters of filter[0] x filter[1], and how
    often its model runs it (``count``; 1 in the set)."""

    name: str
    n: int
    c: int
    h: int
    w: int
    k: int
    filter: tuple[int, int]
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    count: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((size + 2 * p - d * (f - 1) - 1) // s + 1 for size, f, p, s, d in zip(
            (self.h, self.w), self.filter, self.pad, self.stride, self.dilation))  # type: ignore[return-value]

    @property
    def shape(self) -> tuple:
        """Everything that makes the problem (the name and count left out)."""
        return (self.n, self.c, self.h, self.w, self.k, self.filter, self.pad, self.stride, self.dilation,
                self.groups)

    def elements(self, n: int | None = None) -> int:
        """Elements of x and y together at batch ``n`` (default: this layer's)."""
        ho, wo = self.out_hw
        return (self.n if n is None else n) * (self.c * self.h * self.w + self.k * ho * wo)

    @property
    def flops(self) -> int:
        ho, wo = self.out_hw
        return 2 * self.n * self.k * ho * wo * (self.c // self.groups) * self.filter[0] * self.filter[1]

    def problem(self, direction: str, dtype, layout: str):
        """kdbkit's ConvProblem of this layer (``dtype`` a kdbkit DataType)."""
        from kdbkit.runtime.primitives.convolution import ConvProblem

        return ConvProblem(direction, dtype, layout, (self.n, self.c, self.h, self.w), self.k, self.filter,
                           self.pad, self.stride, self.dilation, groups=self.groups)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)  # type: ignore[return-value]


def conv(name: str, c: int, size, k: int, f, *, stride=1, pad=None, dilation=1, groups: int = 1, count: int = 1,
         n: int = BATCH) -> Conv:
    """A layer at ``size`` (one int: square) with an ``f`` filter (one int: square); ``pad``
    defaults to "same" for odd filters (dilation * (f - 1) / 2 on each side)."""
    f, dilation = _pair(f), _pair(dilation)
    pad = tuple(d * (x - 1) // 2 for d, x in zip(dilation, f)) if pad is None else _pair(pad)
    h, w = _pair(size)
    return Conv(name, n, c, h, w, k, f, pad, _pair(stride), dilation, groups, count)


def merged(layers: list[Conv]) -> list[Conv]:
    """Identical layers once (the first's name), their occurrences summed."""
    found: dict[tuple, Conv] = {}
    for layer in layers:
        seen = found.get(layer.shape)
        found[layer.shape] = layer if seen is None else replace(seen, count=seen.count + layer.count)
    return list(found.values())


def _bottleneck_stages(blocks, *, size: int = 56, width_per_planes: int = 1, groups: int = 1,
                       dilate: tuple[bool, ...] = (False, False, False, False)) -> list[Conv]:
    """The bottleneck stages of ResNet v1.5 / ResNeXt (after the stem and max pooling), planes
    64, 128, 256, 512, each block's width ``planes * width_per_planes``, its output 4 * planes.
    A stage with ``dilate`` set keeps its size and dilates its 3 x 3 convolutions by the stride
    it drops (its first block by the previous dilation), as torchvision's
    replace_stride_with_dilation does."""
    layers, cin, dilation = [], 64, 1
    g = f" g{groups}" if groups > 1 else ""
    for stage, count in enumerate(blocks):
        planes = 64 << stage
        width, out = planes * width_per_planes, planes * 4
        stride, first_dilation = (1 if stage == 0 else 2), dilation
        if dilate[stage]:
            dilation, stride = dilation * stride, 1
        s = f"layer{stage + 1}"
        d1 = f" d{first_dilation}" if first_dilation > 1 else ""
        d = f" d{dilation}" if dilation > 1 else ""
        layers += [conv(f"{s} 1x1 {cin}>{width}", cin, size, width, 1),
                   conv(f"{s} 3x3/{stride}{g}{d1} {width}", width, size, width, 3, stride=stride,
                        dilation=first_dilation, groups=groups),
                   conv(f"{s} downsample 1x1/{stride} {cin}>{out}", cin, size, out, 1, stride=stride)]
        size = (size - 1) // stride + 1
        layers += [conv(f"{s} 1x1 {width}>{out}", width, size, out, 1, count=count),
                   conv(f"{s} 1x1 {out}>{width}", out, size, width, 1, count=count - 1),
                   conv(f"{s} 3x3{g}{d} {width}", width, size, width, 3, dilation=dilation, groups=groups,
                        count=count - 1)]
        cin = out
    return layers


def resnet50() -> list[Conv]:
    """ResNet-50 v1.5 at 224 x 224."""
    return [conv("conv1 7x7/2", 3, 224, 64, 7, stride=2), *_bottleneck_stages((3, 4, 6, 3))]


def resnext50() -> list[Conv]:
    """ResNeXt-50 (32x4d) at 224 x 224: bottleneck widths 128 to 1024, the 3 x 3 convolutions in 32 groups."""
    return [conv("conv1 7x7/2", 3, 224, 64, 7, stride=2), *_bottleneck_stages((3, 4, 6, 3), width_per_planes=2,
                                                                               groups=32)]


def mobilenet_v2() -> list[Conv]:
    """MobileNet-V2 (width 1.0) at 224 x 224: expansions, depthwise 3 x 3, projections."""
    layers, cin, size = [conv("conv 3x3/2 3>32", 3, 224, 32, 3, stride=2)], 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            if t != 1:
                layers.append(conv(f"expand 1x1 {cin}>{hidden} @{size}", cin, size, hidden, 1))
            layers.append(conv(f"depthwise 3x3/{stride} {hidden} @{size}", hidden, size, hidden, 3, stride=stride,
                               groups=hidden))
            size //= stride
            layers.append(conv(f"project 1x1 {hidden}>{c} @{size}", hidden, size, c, 1))
            cin = c
    layers.append(conv("conv 1x1 320>1280 @7", 320, 7, 1280, 1))
    return merged(layers)


MODELS = {"resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "resnext50": resnext50}


# The set's networks, each at its own resolution (batch set later).

def resnet18() -> list[Conv]:
    layers, cin, size = [conv("conv1 7x7/2", 3, 224, 64, 7, stride=2)], 64, 56
    for stage in range(4):
        width, stride = 64 << stage, (1 if stage == 0 else 2)
        layers.append(conv(f"layer{stage + 1} 3x3/{stride} {cin}>{width}", cin, size, width, 3, stride=stride))
        if stride > 1:
            layers.append(conv(f"layer{stage + 1} downsample 1x1/2 {cin}>{width}", cin, size, width, 1, stride=2))
        size //= stride
        if stride > 1:
            layers.append(conv(f"layer{stage + 1} 3x3 {width}", width, size, width, 3))
        cin = width
    return layers


def resnext101(groups: int) -> list[Conv]:
    """ResNeXt-101 32x8d or 64x4d: both have widths 256 to 2048; 8 or 4 channels per group."""
    return _bottleneck_stages((3, 4, 23, 3), width_per_planes=4, groups=groups)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding (to a multiple of 8, never below 90% of v)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _inverted_residual(tag: str, cin: int, hidden: int, cout: int, size: int, kernel: int, stride: int,
                       squeeze: int) -> tuple[list[Conv], int]:
    """An inverted-residual block (expansion, depthwise, squeeze-and-excitation's two 1 x 1
    convolutions on the pooled 1 x 1 plane, projection) and its output size."""
    layers = []
    if hidden != cin:
        layers.append(conv(f"{tag} expand 1x1 {cin}>{hidden} @{size}", cin, size, hidden, 1))
    layers.append(conv(f"{tag} depthwise {kernel}x{kernel}/{stride} {hidden} @{size}", hidden, size, hidden, kernel,
                       stride=stride, groups=hidden))
    size = (size - 1) // stride + 1
    if squeeze:
        layers += [conv(f"{tag} se 1x1 {hidden}>{squeeze}", hidden, 1, squeeze, 1),
                   conv(f"{tag} se 1x1 {squeeze}>{hidden}", squeeze, 1, hidden, 1)]
    layers.append(conv(f"{tag} project 1x1 {hidden}>{cout} @{size}", hidden, size, cout, 1))
    return layers, size


def mobilenet_v3_large() -> list[Conv]:
    """MobileNet-V3 large at 224 x 224 (3 x 3 and 5 x 5 depthwise, squeeze-and-excitation)."""
    layers, size = [conv("conv 3x3/2 3>16", 3, 224, 16, 3, stride=2)], 112
    config = ((16, 3, 16, 16, False, 1), (16, 3, 64, 24, False, 2), (24, 3, 72, 24, False, 1),
              (24, 5, 72, 40, True, 2), (40, 5, 120, 40, True, 1), (40, 5, 120, 40, True, 1),
              (40, 3, 240, 80, False, 2), (80, 3, 200, 80, False, 1), (80, 3, 184, 80, False, 1),
              (80, 3, 184, 80, False, 1), (80, 3, 480, 112, True, 1), (112, 3, 672, 112, True, 1),
              (112, 5, 672, 160, True, 2), (160, 5, 960, 160, True, 1), (160, 5, 960, 160, True, 1))
    for i, (cin, kernel, hidden, cout, se, stride) in enumerate(config):
        block, size = _inverted_residual(f"block{i + 1}", cin, hidden, cout, size, kernel, stride,
                                         _make_divisible(hidden // 4) if se else 0)
        layers += block
    layers.append(conv("conv 1x1 160>960 @7", 160, 7, 960, 1))
    return layers


def efficientnet_b0() -> list[Conv]:
    """EfficientNet-B0 at 224 x 224 (MBConv with 3 x 3 and 5 x 5 depthwise; its squeeze-and-excitation
    1 x 1 convolutions on the pooled plane are left out, MobileNet-V3's stand for them)."""
    layers, size, cin = [conv("stem 3x3/2 3>32", 3, 224, 32, 3, stride=2)], 112, 32
    for stage, (expand, kernel, stride, cout, repeats) in enumerate(
            ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
             (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))):
        for i in range(repeats):
            block, size = _inverted_residual(f"stage{stage + 1}", cin, cin * expand, cout, size, kernel,
                                             stride if i == 0 else 1, 0)
            layers += block
            cin = cout
    layers.append(conv("head 1x1 320>1280 @7", 320, 7, 1280, 1))
    return layers


def densenet121() -> list[Conv]:
    """DenseNet-121 at 224 x 224 (growth 32): every third dense layer's 1 x 1 bottleneck (its
    input widening by 32 each layer), the 3 x 3 convolutions and the transitions."""
    layers, c, size = [conv("conv0 7x7/2 3>64", 3, 224, 64, 7, stride=2)], 64, 56
    for block, n in enumerate((6, 12, 24, 16)):
        for i in range(0, n, 3):
            cin = c + 32 * i
            layers.append(conv(f"block{block + 1} 1x1 {cin}>128 @{size}", cin, size, 128, 1))
        layers.append(conv(f"block{block + 1} 3x3 128>32 @{size}", 128, size, 32, 3))
        c += 32 * n
        if block < 3:
            layers.append(conv(f"transition{block + 1} 1x1 {c}>{c // 2} @{size}", c, size, c // 2, 1))
            c, size = c // 2, size // 2
    return layers


def inception_v3() -> list[Conv]:
    """Inception-v3 at 299 x 299: the unpadded stem (299, 149, 147, 73, 71), 35 x 35 blocks with
    5 x 5, 17 x 17 blocks with 1 x 7 and 7 x 1, 8 x 8 blocks with 1 x 3 and 3 x 1, the auxiliary head."""
    layers = [conv("Conv2d_1a 3x3/2 3>32", 3, 299, 32, 3, stride=2, pad=0),
              conv("Conv2d_2a 3x3 32>32 @149", 32, 149, 32, 3, pad=0),
              conv("Conv2d_2b 3x3 32>64 @147", 32, 147, 64, 3),
              conv("Conv2d_3b 1x1 64>80 @73", 64, 73, 80, 1),
              conv("Conv2d_4a 3x3 80>192 @73", 80, 73, 192, 3, pad=0)]
    for tag, cin, pool in (("Mixed_5b", 192, 32), ("Mixed_5c", 256, 64), ("Mixed_5d", 288, 64)):
        layers += [conv(f"{tag} 1x1 {cin}>64", cin, 35, 64, 1), conv(f"{tag} 1x1 {cin}>48", cin, 35, 48, 1),
                   conv(f"{tag} 5x5 48>64", 48, 35, 64, 5), conv(f"{tag} 3x3 64>96", 64, 35, 96, 3),
                   conv(f"{tag} 3x3 96>96", 96, 35, 96, 3), conv(f"{tag} pool 1x1 {cin}>{pool}", cin, 35, pool, 1)]
    layers += [conv("Mixed_6a 3x3/2 288>384", 288, 35, 384, 3, stride=2, pad=0),
               conv("Mixed_6a 3x3/2 96>96", 96, 35, 96, 3, stride=2, pad=0)]
    for tag, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        layers += [conv(f"{tag} 1x1 768>192", 768, 17, 192, 1), conv(f"{tag} 1x1 768>{c7}", 768, 17, c7, 1),
                   conv(f"{tag} 1x7 {c7}>{c7}", c7, 17, c7, (1, 7)), conv(f"{tag} 7x1 {c7}>192", c7, 17, 192, (7, 1)),
                   conv(f"{tag} 7x1 {c7}>{c7}", c7, 17, c7, (7, 1)), conv(f"{tag} 1x7 {c7}>192", c7, 17, 192, (1, 7))]
    layers += [conv("AuxLogits 1x1 768>128 @5", 768, 5, 128, 1), conv("AuxLogits 5x5 128>768 @5", 128, 5, 768, 5,
                                                                      pad=0),
               conv("Mixed_7a 3x3/2 192>320", 192, 17, 320, 3, stride=2, pad=0),
               conv("Mixed_7a 1x7 192>192", 192, 17, 192, (1, 7)), conv("Mixed_7a 7x1 192>192", 192, 17, 192, (7, 1)),
               conv("Mixed_7a 3x3/2 192>192", 192, 17, 192, 3, stride=2, pad=0)]
    for tag, cin in (("Mixed_7b", 1280), ("Mixed_7c", 2048)):
        layers += [conv(f"{tag} 1x1 {cin}>320", cin, 8, 320, 1), conv(f"{tag} 1x1 {cin}>384", cin, 8, 384, 1),
                   conv(f"{tag} 1x1 {cin}>448", cin, 8, 448, 1), conv(f"{tag} pool 1x1 {cin}>192", cin, 8, 192, 1)]
    layers += [conv("Mixed_7b 1x3 384>384", 384, 8, 384, (1, 3)), conv("Mixed_7b 3x1 384>384", 384, 8, 384, (3, 1)),
               conv("Mixed_7b 3x3 448>384", 448, 8, 384, 3)]
    return layers


def vgg16() -> list[Conv]:
    widths = ((3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56), (256, 256, 56),
              (256, 512, 28), (512, 512, 28), (512, 512, 14))
    return [conv(f"3x3 {c}>{k} @{size}", c, size, k, 3) for c, k, size in widths]


def deeplabv3_resnet101() -> list[Conv]:
    """DeepLab-v3 on ResNet-101 at 513 x 513, output stride 8: layer3 dilated by 2, layer4 by 4
    (each first block by the previous dilation), ASPP at rates 12, 24 and 36, the head."""
    stem = [conv("conv1 7x7/2 @513", 3, 513, 64, 7, stride=2)]
    backbone = _bottleneck_stages((3, 4, 23, 3), size=129, dilate=(False, False, True, True))
    aspp = [conv("ASPP 1x1 2048>256", 2048, 65, 256, 1),
            *(conv(f"ASPP 3x3 d{r} 2048>256", 2048, 65, 256, 3, dilation=r) for r in (12, 24, 36)),
            conv("ASPP pooling 1x1 2048>256", 2048, 1, 256, 1), conv("ASPP project 1x1 1280>256", 1280, 65, 256, 1),
            conv("head 3x3 256>256", 256, 65, 256, 3), conv("classifier 1x1 256>21", 256, 65, 21, 1)]
    return stem + backbone + aspp


def deeplabv3_cityscapes() -> list[Conv]:
    """DeepLab-v3's dilated convolutions again on a 769 x 769 Cityscapes crop (97 x 97 after
    the stem and layer2): layer3's and layer4's 3 x 3 and ASPP's."""
    return [c for c in _bottleneck_stages((3, 4, 23, 3), size=193, dilate=(False, False, True, True))
            if max(c.dilation) > 1] + \
        [conv(f"ASPP 3x3 d{r} 2048>256", 2048, 97, 256, 3, dilation=r) for r in (12, 24, 36)]


def unet() -> list[Conv]:
    """The original U-Net: unpadded 3 x 3 convolutions from a one-channel 572 x 572 image
    (572, 570, 284, ... 28, then the decoder's 56 ... 388) and the 1 x 1 classifier."""
    layers, cin, size = [], 1, 572
    for width in (64, 128, 256, 512, 1024):
        layers += [conv(f"down 3x3 {cin}>{width} @{size}", cin, size, width, 3, pad=0),
                   conv(f"down 3x3 {width}>{width} @{size - 2}", width, size - 2, width, 3, pad=0)]
        cin, bottom, size = width, size - 4, (size - 4) // 2  # the last pooling is not taken
    size = bottom * 2  # each up-convolution doubles the plane; its output meets the cropped skip
    for width in (512, 256, 128, 64):
        layers += [conv(f"up 3x3 {2 * width}>{width} @{size}", 2 * width, size, width, 3, pad=0),
                   conv(f"up 3x3 {width}>{width} @{size - 2}", width, size - 2, width, 3, pad=0)]
        size = (size - 4) * 2
    layers.append(conv("classifier 1x1 64>2 @388", 64, 388, 2, 1))
    return layers


def yolov3() -> list[Conv]:
    """YOLOv3 at 416 x 416: Darknet-53's strided 3 x 3 and residual 1 x 1 / 3 x 3 pairs at 208
    to 13, and the three heads' 1 x 1 convolutions (255 outputs: 3 anchors x 85)."""
    layers, cin, size = [conv("conv 3x3 3>32 @416", 3, 416, 32, 3)], 32, 416
    for width in (64, 128, 256, 512, 1024):
        layers.append(conv(f"down 3x3/2 {cin}>{width} @{size}", cin, size, width, 3, stride=2))
        size //= 2
        layers += [conv(f"res 1x1 {width}>{width // 2} @{size}", width, size, width // 2, 1),
                   conv(f"res 3x3 {width // 2}>{width} @{size}", width // 2, size, width, 3)]
        cin = width
    layers += [conv("head 1x1 1024>255 @13", 1024, 13, 255, 1), conv("route 1x1 512>256 @13", 512, 13, 256, 1),
               conv("head 1x1 768>256 @26", 768, 26, 256, 1), conv("head 1x1 512>255 @26", 512, 26, 255, 1),
               conv("route 1x1 256>128 @26", 256, 26, 128, 1), conv("head 1x1 384>128 @52", 384, 52, 128, 1),
               conv("head 1x1 256>255 @52", 256, 52, 255, 1)]
    return layers


SET_NETWORKS = {
    "resnet18": resnet18, "resnet50": resnet50, "resnext50_32x4d": resnext50,
    "resnext101_32x8d": lambda: resnext101(32), "resnext101_64x4d": lambda: resnext101(64),
    "mobilenet_v2": mobilenet_v2, "mobilenet_v3_large": mobilenet_v3_large, "efficientnet_b0": efficientnet_b0,
    "densenet121": densenet121, "inception_v3": inception_v3, "vgg16": vgg16,
    "deeplabv3_resnet101": deeplabv3_resnet101, "deeplabv3_cityscapes": deeplabv3_cityscapes, "unet": unet,
    "yolov3": yolov3,
}


def capped_batch(layer: Conv, n: int) -> int:
    """``n`` halved until the layer's x and y fit SET_ELEMENTS_CAP (at least 1)."""
    while n > 1 and layer.elements(n) > SET_ELEMENTS_CAP:
        n //= 2
    return n


def problem_set() -> list[Conv]:
    """The benchmark set: every network's distinct layers, each at a batch of SET_BATCHES
    (capped by memory), named ``<network> <layer>``; a problem that another network already
    gave (same shape and batch) is kept once, under its first name."""
    found: dict[tuple, Conv] = {}
    for j, (net, layers) in enumerate(SET_NETWORKS.items()):
        for i, layer in enumerate(merged(layers())):
            n = capped_batch(layer, SET_BATCHES[(5 * j + i) % len(SET_BATCHES)])
            problem = replace(layer, name=f"{net} {layer.name}", n=n, count=1)
            found.setdefault(problem.shape, problem)
    return list(found.values())


def network_of(problem: Conv) -> str:
    return problem.name.split(" ", 1)[0]


def spread(problems: list[Conv], count: int | None) -> list[Conv]:
    """``count`` of the set's problems (all if None or more), taken from the networks in turn
    and from across each network's list (golden-ratio steps), in the set's order: a check of
    the set that visits every network once ``count`` reaches their number."""
    if count is None or count >= len(problems):
        return list(problems)
    by_net: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        by_net.setdefault(network_of(p), []).append(i)
    queues = [sorted(found, key=lambda i: (found.index(i) * 0.6180339887) % 1) for found in by_net.values()]
    picked: list[int] = []
    while len(picked) < count:
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return [problems[i] for i in sorted(picked)]
