"""The layer-norm solvers; importing this package registers them. Ids: 7 LayerNormBlock."""

from kdbkit.runtime.primitives.layernorm.solvers import block  # noqa: F401  (registers)
