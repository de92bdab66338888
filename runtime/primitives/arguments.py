"""The primitives' non-tensor arguments: scalars (alpha, beta, eps, ...) and integer parameters
(pad, stride, dilation, window, groups, ...), checked once, in one place.

A call's arguments become a problem whose config string keys the find-db, so a value is
refused rather than coerced: ``float("1.5")`` or ``int(1.5)`` would silently make another
problem than the caller meant (``pad=1.5`` run as ``pad=1``).
"""

from __future__ import annotations

import operator
from typing import Any

from kdbkit.runtime.errors import ProblemError


def scalar(value: Any, name: str) -> float:
    """``value`` as a float: a Python or NumPy real number (or a 0-d array of one).

    Raises:
        ProblemError: a string, a bool, a complex number or anything else that is no real
            number, naming ``name``.
    """
    if type(value) is float:  # the usual case, first
        return value
    if not isinstance(value, (str, bytes, bool)) and getattr(value, "dtype", None) != bool:
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise ProblemError(f"{name}={value!r} is not a number", f"pass {name} as a float, e.g. {name}=1.0")


def integer(value: Any, name: str, primitive: str = "") -> int:
    """``value`` as an int: a Python or NumPy integer, never a bool, a float or a string.

    Raises:
        ProblemError: anything else, naming ``name`` (after ``primitive``, where given).
    """
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ProblemError(f"{primitive} {name}={value!r} is not an integer".lstrip(),
                       f"pass {name} as an int, e.g. {name}=1")


def int_pair(values: Any, name: str, primitive: str = "") -> tuple[int, int]:
    """``values`` as (height, width): one integer for both, or a tuple or list of two.

    Raises:
        ProblemError: not two integers, naming ``name`` (after ``primitive``, where given).
    """
    items = values if isinstance(values, (tuple, list)) else (values, values)
    if len(items) != 2:
        raise ProblemError(f"{primitive} {name} {tuple(items)} is not two sizes (height, width)".lstrip(),
                           f"give {name} as (h, w)")
    return integer(items[0], name, primitive), integer(items[1], name, primitive)
