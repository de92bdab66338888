"""The activation solvers, one per module; importing this package registers them.

Ids are stable: 1 ActivPacked, 2 ActivStrided. New solvers take the next free id.
"""

from kdbkit.runtime.primitives.activation.solvers import packed, strided  # noqa: F401  (registers)
