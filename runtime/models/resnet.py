"""ResNet-18 and ResNet-50 as torchvision defines them (ResNet-50 v1.5: the stride on the
bottleneck's 3 x 3), for inference: convolutions without bias, batch norm, ReLU, a 3 x 3 / 2
max pool, residual additions, global average pooling and the fully connected classifier.
Parameter names are torchvision's state-dict keys.
"""

from __future__ import annotations

from kdbkit.runtime.models.graph import Graph
from kdbkit.runtime.models.layers import Activation, Add, BatchNorm, Conv, GlobalAvgPool, Linear, MaxPool

# A residual branch's last batch norm scales by about this much, so that the sum over the
# blocks stays of order one (as torchvision's zero_init_residual, but not zero: every layer
# must still count in a comparison).
RESIDUAL_SCALE = (0.2, 0.4)


def _conv_bn(g: Graph, x: str, name: str, bn: str, channels: int, kernel: int, stride: int = 1, *,
             relu: bool = True, residual_last: bool = False) -> str:
    x = g.add(Conv(channels, kernel, stride=stride, pad=kernel // 2), x, name=name)
    x = g.add(BatchNorm(scale=RESIDUAL_SCALE) if residual_last else BatchNorm(), x, name=bn)
    return g.add(Activation("relu"), x) if relu else x


def _basic_block(g: Graph, x: str, name: str, channels: int, stride: int) -> str:
    identity = x
    y = _conv_bn(g, x, f"{name}.conv1", f"{name}.bn1", channels, 3, stride)
    y = _conv_bn(g, y, f"{name}.conv2", f"{name}.bn2", channels, 3, relu=False, residual_last=True)
    if stride != 1 or g.shapes[x][1] != channels:
        identity = _conv_bn(g, x, f"{name}.downsample.0", f"{name}.downsample.1", channels, 1, stride, relu=False)
    return g.add(Activation("relu"), g.add(Add(), y, identity))


def _bottleneck(g: Graph, x: str, name: str, width: int, stride: int) -> str:
    identity, out = x, width * 4
    y = _conv_bn(g, x, f"{name}.conv1", f"{name}.bn1", width, 1)
    y = _conv_bn(g, y, f"{name}.conv2", f"{name}.bn2", width, 3, stride)
    y = _conv_bn(g, y, f"{name}.conv3", f"{name}.bn3", out, 1, relu=False, residual_last=True)
    if stride != 1 or g.shapes[x][1] != out:
        identity = _conv_bn(g, x, f"{name}.downsample.0", f"{name}.downsample.1", out, 1, stride, relu=False)
    return g.add(Activation("relu"), g.add(Add(), y, identity))


def _resnet(block, blocks: tuple[int, ...], batch: int, image: int, num_classes: int) -> Graph:
    g = Graph((batch, 3, image, image))
    x = _conv_bn(g, g.input, "conv1", "bn1", 64, 7, 2)
    x = g.add(MaxPool(3, 2, 1), x, name="maxpool")
    for stage, count in enumerate(blocks):
        for i in range(count):
            x = block(g, x, f"layer{stage + 1}.{i}", 64 * 2**stage, 2 if stage > 0 and i == 0 else 1)
    x = g.add(GlobalAvgPool(), x, name="avgpool")
    g.add(Linear(num_classes), x, name="fc")
    return g


def resnet18(*, batch: int = 1, image: int = 224, num_classes: int = 1000) -> Graph:
    """ResNet-18 (basic blocks 2, 2, 2, 2) on ``batch`` x 3 x ``image`` x ``image``."""
    return _resnet(_basic_block, (2, 2, 2, 2), batch, image, num_classes)


def resnet50(*, batch: int = 1, image: int = 224, num_classes: int = 1000) -> Graph:
    """ResNet-50 (bottlenecks 3, 4, 6, 3) on ``batch`` x 3 x ``image`` x ``image``."""
    return _resnet(_bottleneck, (3, 4, 6, 3), batch, image, num_classes)
