"""The primitives: one package each, with its problem (config string), solvers and API.

Importing a primitive's package registers its solvers (:data:`kdbkit.runtime.solver.REGISTRY`);
:func:`load_all` imports every one, for tools that list or build all solvers.
"""

from __future__ import annotations

import importlib

PRIMITIVES = ("activation", "softmax", "tensorop", "layernorm", "pooling", "batchnorm", "gemm", "convolution")


def load_all() -> None:
    """Import every primitive package, so that every solver is registered."""
    for name in PRIMITIVES:
        importlib.import_module(f"kdbkit.runtime.primitives.{name}")
