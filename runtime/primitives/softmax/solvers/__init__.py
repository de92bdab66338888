"""The softmax solvers, one per module; importing this package registers them.

Ids are stable: 3 SoftmaxThread, 4 SoftmaxBlock (a thread per row is tried first: it suits
the many short rows of channel mode, and declines long rows).
"""

from kdbkit.runtime.primitives.softmax.solvers import thread, block  # noqa: F401,I001  (registers, in this order)
