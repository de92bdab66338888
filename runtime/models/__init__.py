"""Built-in networks, defined by their layers: ResNet-18, ResNet-50, VGG-16, MobileNet-V2
(torchvision's architectures, inference) and BERT-base's encoder layers.

Each is a problem catalogue (every primitive problem its forward asks kdbkit's solvers for,
which the packager builds into bundles) and a runnable forward through kdbkit, with float64
NumPy and PyTorch references of the same parameters. Sizes are parameters, so tests run small
instances of the same definitions.

Example::

    import numpy as np
    import kdbkit
    from kdbkit.runtime import models

    net = models.build("resnet18", batch=1, image=64, dtype="fp32", layout="NHWC")
    x = np.random.default_rng(0).standard_normal(net.input_shape)
    with kdbkit.Handle() as handle:
        logits = net.forward(handle, x)
    error = np.linalg.norm(logits - net.reference_forward(x)) / np.linalg.norm(net.reference_forward(x))
    models.problems("resnet50", 32, "fp16", "NHWC")       # the problems of one forward
    models.builtin_catalogue("resnet50")                   # batch 1 and 32, fp16 and fp32, both layouts
"""

from __future__ import annotations

import inspect
from typing import Callable

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.models.bert import bert_base
from kdbkit.runtime.models.graph import Graph
from kdbkit.runtime.models.mobilenet import mobilenet_v2
from kdbkit.runtime.models.network import Network
from kdbkit.runtime.models.resnet import resnet18, resnet50
from kdbkit.runtime.models.vgg import vgg16
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.tensor import DataType

#: name -> builder: keyword sizes (``batch``, ``image`` or BERT's ``seq``, ``hidden``, ...) -> Graph
MODELS: dict[str, Callable[..., Graph]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "mobilenet_v2": mobilenet_v2,
    "bert_base": bert_base,
}

#: what builtin_catalogue covers
CATALOGUE_BATCHES = (1, 32)
CATALOGUE_TYPES = ("fp16", "fp32")


def build(name: str, *, batch: int = 1, dtype: str | DataType = "fp32", layout: str = "NCHW", seed: int = 0,
          **sizes: int) -> Network:
    """The network ``name`` for one input shape, type and layout, its parameters drawn from ``seed``.

    Args:
        sizes: the builder's other sizes: ``image`` (224) and ``num_classes`` for the image
            networks; ``seq`` (128), ``hidden``, ``heads``, ``intermediate``, ``layers`` and
            ``eps`` for BERT.

    Raises:
        ProblemError: an unknown name, size, type or layout.
    """
    builder = MODELS.get(name)
    if builder is None:
        raise ProblemError(f"no built-in network {name!r}", f"use one of {', '.join(MODELS)}")
    accepted = inspect.signature(builder).parameters
    unknown = sorted(set(sizes) - set(accepted))
    if unknown:
        raise ProblemError(f"{name} has no size {', '.join(unknown)}",
                           f"it takes {', '.join(p for p in accepted if p != 'batch')}")
    graph = builder(batch=batch, **sizes)
    return Network(name, graph, dtype=dtype, layout=layout, seed=seed)


def problems(name: str, batch: int, dtype: str | DataType, layout: str = "NCHW", **sizes: int) -> list[Problem]:
    """Every primitive problem a forward of ``name`` asks kdbkit's solvers for, each once.

    Args:
        sizes: as :func:`build` (``image=224``, or BERT's ``seq=128``, ...).

    Raises:
        ProblemError: as :func:`build`.
    """
    return build(name, batch=batch, dtype=dtype, layout=layout, **sizes).problems()


def builtin_catalogue(name: str) -> list[Problem]:
    """The problems of ``name`` at its default sizes over batch 1 and 32, fp16 and fp32, and
    (image networks) NCHW and NHWC: what a built-in bundle compiles for it, each problem once.

    Raises:
        ProblemError: an unknown name.
    """
    if name not in MODELS:
        raise ProblemError(f"no built-in network {name!r}", f"use one of {', '.join(MODELS)}")
    layouts = MODELS[name](batch=1).layouts
    seen: dict[str, Problem] = {}
    for batch in CATALOGUE_BATCHES:
        for dtype in CATALOGUE_TYPES:
            for layout in layouts:
                for problem in problems(name, batch, dtype, layout):
                    seen.setdefault(problem.config(), problem)
    return list(seen.values())


__all__ = ["CATALOGUE_BATCHES", "CATALOGUE_TYPES", "MODELS", "Network", "build", "builtin_catalogue", "problems"]
