"""The batch-norm solvers; importing this package registers them. Ids: 9 BatchNormBlock."""

from kdbkit.runtime.primitives.batchnorm.solvers import block  # noqa: F401  (registers)
