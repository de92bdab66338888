"""The softmax solvers, one per module; importing this package registers them.

Ids are stable: 3 SoftmaxThread, 4 SoftmaxBlock, 12 SoftmaxRows, 14 SoftmaxLanes. Immediate
mode tries them in this order: rows of contiguous 16-byte vectors held in registers by a run
of lanes, a thread per row for short rows (channel mode), 32 threads per row for rows up to
1024 (forward), a group per row for the rest.
"""

from kdbkit.runtime.primitives.softmax.solvers import lanes, thread, rows, block  # noqa: F401,I001  (registers, in this order)
