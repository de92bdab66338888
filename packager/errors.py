"""The packager's errors: a build target it cannot build, a package it cannot make or install, a
cluster cache it cannot publish to.

Both are :class:`~kdbkit.kdb.errors.KdbError`\\ s (a ``problem`` and a ``remedy``, printed by the
CLI as one line); ``kdbkit.TargetError`` and ``kdbkit.PackageError`` name them too.
"""

from __future__ import annotations

from kdbkit.kdb.errors import KdbError


class TargetError(KdbError, ValueError):
    """A build target or GPU name that no installed compiler builds or the table of known GPUs
    does not hold; the message lists what there is."""


class PackageError(KdbError):
    """A kernel package or bundle that cannot be packaged, verified or installed: a SHA-256 that
    does not match, an unsafe archive member, a wheel for another target, pip refusing it."""


class CatalogueError(KdbError, ValueError):
    """A catalogue that names nothing to build (an empty file, only comments or bad lines)."""


class PublishError(KdbError, ValueError):
    """A ``--publish`` destination refused before anything builds: not a Redis URL, or no redis
    client to reach it. (A server that is down or read-only is no error: the build goes on and
    says what it could not publish.)"""


class LockError(PackageError):
    """A lock file (``kdbkit.lock``) that cannot be read or written, or an environment or folder
    of wheels that differs from it: the message names the file, or the package and the first
    difference."""
