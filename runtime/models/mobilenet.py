"""MobileNet-V2 (width 1.0) as torchvision defines it, for inference: convolution + batch norm +
ReLU6 (clipped ReLU, alpha 6) blocks, inverted residuals (1 x 1 expansion, 3 x 3 depthwise,
linear 1 x 1 projection, a residual addition where stride and channels allow), global average
pooling and the classifier (dropout is the identity in inference). Parameter names are
torchvision's state-dict keys.
"""

from __future__ import annotations

from kdbkit.runtime.models.graph import Graph
from kdbkit.runtime.models.layers import Activation, Add, BatchNorm, Conv, GlobalAvgPool, Linear

# (expansion t, output channels c, repeats n, first stride s), torchvision's table
INVERTED_RESIDUALS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                      (6, 320, 1, 1))
RESIDUAL_SCALE = (0.2, 0.4)  # the projection's batch norm where a residual follows (see resnet.py)


def _conv_bn_relu6(g: Graph, x: str, name: str, channels: int, kernel: int, stride: int = 1,
                   groups: int = 1) -> str:
    """torchvision's Conv2dNormActivation: ``name.0`` the convolution, ``name.1`` the batch norm."""
    x = g.add(Conv(channels, kernel, stride=stride, pad=(kernel - 1) // 2, groups=groups), x, name=f"{name}.0")
    x = g.add(BatchNorm(), x, name=f"{name}.1")
    return g.add(Activation("clippedrelu", alpha=6.0), x)


def _inverted_residual(g: Graph, x: str, name: str, out: int, stride: int, expansion: int) -> str:
    cin = g.shapes[x][1]
    hidden, residual = cin * expansion, stride == 1 and cin == out
    y, i = x, 0
    if expansion != 1:
        y, i = _conv_bn_relu6(g, y, f"{name}.conv.0", hidden, 1), 1
    y = _conv_bn_relu6(g, y, f"{name}.conv.{i}", hidden, 3, stride, groups=hidden)
    y = g.add(Conv(out, 1, gain=1.0), y, name=f"{name}.conv.{i + 1}")
    y = g.add(BatchNorm(scale=RESIDUAL_SCALE) if residual else BatchNorm(), y, name=f"{name}.conv.{i + 2}")
    return g.add(Add(), y, x) if residual else y


def mobilenet_v2(*, batch: int = 1, image: int = 224, num_classes: int = 1000) -> Graph:
    """MobileNet-V2 on ``batch`` x 3 x ``image`` x ``image``."""
    g = Graph((batch, 3, image, image))
    x = _conv_bn_relu6(g, g.input, "features.0", 32, 3, 2)
    index = 1
    for t, c, n, s in INVERTED_RESIDUALS:
        for i in range(n):
            x = _inverted_residual(g, x, f"features.{index}", c, s if i == 0 else 1, t)
            index += 1
    x = _conv_bn_relu6(g, x, f"features.{index}", 1280, 1)
    x = g.add(GlobalAvgPool(), x)
    g.add(Linear(num_classes), x, name="classifier.1")
    return g
