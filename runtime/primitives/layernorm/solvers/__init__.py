"""The layer-norm solvers, registered from :data:`SOLVERS` in priority order. Ids: 7
LayerNormBlock, 15 LayerNormLanes. Immediate mode tries the lanes kernel (forward, rows of
whole 16-byte vectors) first, then a group per row."""

from kdbkit.runtime.primitives.layernorm.solvers.block import LayerNormBlock
from kdbkit.runtime.primitives.layernorm.solvers.lanes import LayerNormLanes
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (LayerNormLanes, LayerNormBlock)
REGISTRY.register_all(SOLVERS)
