"""The softmax solvers, one per module, registered from :data:`SOLVERS` in priority order.

Ids are stable: 3 SoftmaxThread, 4 SoftmaxBlock, 12 SoftmaxRows, 14 SoftmaxLanes. Immediate
mode tries them in this order: rows of contiguous 16-byte vectors held in registers by a run
of lanes, a thread per row for short rows (channel mode), 32 threads per row for rows up to
1024 (forward), a group per row for the rest.
"""

from kdbkit.runtime.primitives.softmax.solvers.block import SoftmaxBlock
from kdbkit.runtime.primitives.softmax.solvers.lanes import SoftmaxLanes
from kdbkit.runtime.primitives.softmax.solvers.rows import SoftmaxRows
from kdbkit.runtime.primitives.softmax.solvers.thread import SoftmaxThread
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (SoftmaxLanes, SoftmaxThread, SoftmaxRows, SoftmaxBlock)
REGISTRY.register_all(SOLVERS)
