"""VGG-16 (configuration D, no batch norm) as torchvision defines it, for inference: 3 x 3
convolutions with bias and ReLU, 2 x 2 max pools, and three fully connected layers (dropout is
the identity in inference). Parameter names are torchvision's state-dict keys.

torchvision pools the features to 7 x 7 (adaptive average) before the classifier: at 224 x 224
they already are 7 x 7 and the pool is the identity, so it is left out. At another image size
the first fully connected layer takes the features as they are, 512 x (image / 32)^2 of them
(torchvision's would pool or repeat them to 512 x 7 x 7).
"""

from __future__ import annotations

from kdbkit.runtime.models.graph import Graph
from kdbkit.runtime.models.layers import Activation, Conv, Linear, MaxPool

CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(*, batch: int = 1, image: int = 224, num_classes: int = 1000) -> Graph:
    """VGG-16 on ``batch`` x 3 x ``image`` x ``image`` (image a multiple of 32)."""
    g = Graph((batch, 3, image, image))
    x, index = g.input, 0  # torchvision's feature index: it counts each ReLU as a layer
    for item in CONFIG_D:
        if item == "M":
            x, index = g.add(MaxPool(2, 2), x, name=f"features.{index}"), index + 1
        else:
            x = g.add(Conv(item, 3, pad=1, bias=True), x, name=f"features.{index}")
            x, index = g.add(Activation("relu"), x, name=f"features.{index + 1}"), index + 2
    x = g.add(Activation("relu"), g.add(Linear(4096, gain=2.0), x, name="classifier.0"))
    x = g.add(Activation("relu"), g.add(Linear(4096, gain=2.0), x, name="classifier.3"))
    g.add(Linear(num_classes), x, name="classifier.6")
    return g
