"""The pooling solvers, registered from :data:`SOLVERS` in priority order. Ids: 8 PoolDirect,
17 PoolBand, 18 PoolStrip, 53 PoolChannelsLast. Immediate mode tries PoolChannelsLast first
(forward, channels-last tensors), then PoolStrip (forward, for its window geometries), then
PoolBand (forward, when a band of input rows fits its stage)."""

from kdbkit.runtime.primitives.pooling.solvers.band import PoolBand
from kdbkit.runtime.primitives.pooling.solvers.channels_last import PoolChannelsLast
from kdbkit.runtime.primitives.pooling.solvers.direct import PoolDirect
from kdbkit.runtime.primitives.pooling.solvers.strip import PoolStrip
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (PoolChannelsLast, PoolStrip, PoolBand, PoolDirect)
REGISTRY.register_all(SOLVERS)
