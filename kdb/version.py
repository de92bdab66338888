"""kdbkit's version: the one place it is written (pyproject reads it too)."""

__version__ = "0.2.0"
