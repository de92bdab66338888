"""PoCL's own kernel cache, kept in kdbkit's user cache folder.

PoCL (the embedded OpenCL device on the CPU) finishes every program it loads with a compile
of its own at the first launch, even a binary from a bundle; its kernel cache keeps that
work for the next process. kdbkit keeps that cache beside its own, in
``<user cache folder>/pocl`` (per kdbkit version, as the ``.ukdb`` files are), so that a
user's second process starts fast and ``kdb cache clear`` clears both.

PoCL reads ``POCL_CACHE_DIR`` and ``POCL_KERNEL_CACHE`` once, when it loads, so
:func:`configure` runs before pyopencl asks for a platform (``backends.opencl.cl_module``).
A setting the user made is kept; with ``KDB_DISABLE_CACHE`` kdbkit leaves PoCL as it is.
The folder holds native code that PoCL runs, so it is made private (0700), and one that
another user owns or others may write is not used.
"""

from __future__ import annotations

import os
from pathlib import Path

from kdbkit.runtime import env, paths, private_folder
from kdbkit.runtime.logging_setup import get_logger

FOLDER_NAME = "pocl"  # inside the user cache folder
_log = get_logger(__name__)
_configured = False


def folder(cache_folder: Path | None = None) -> Path:
    """Where kdbkit keeps PoCL's kernel cache: ``<user cache folder>/pocl``."""
    return (cache_folder or paths.user_cache_dir()) / FOLDER_NAME


def configure() -> Path | None:
    """Point PoCL's kernel cache at :func:`folder` and switch it on, unless the user set
    ``POCL_CACHE_DIR`` or ``POCL_KERNEL_CACHE`` (each kept as set; with ``POCL_KERNEL_CACHE=0``
    PoCL gets no folder either) or ``KDB_DISABLE_CACHE``.
    Runs once per process; call it before PoCL loads.

    Returns:
        The folder now in ``POCL_CACHE_DIR`` if kdbkit set it, else None.
    """
    global _configured
    if _configured:
        return None
    _configured = True
    if env.get_bool("KDB_DISABLE_CACHE"):
        return None
    if os.environ.get("POCL_KERNEL_CACHE", "").strip() == "0":
        return None  # turned off by the user: PoCL would still leave temporary files in a folder it is given
    chosen = None
    if "POCL_CACHE_DIR" not in os.environ:
        target = folder()
        if _private_folder(target):
            os.environ["POCL_CACHE_DIR"] = str(target)
            chosen = target
    if chosen is not None or "POCL_CACHE_DIR" in os.environ:
        os.environ.setdefault("POCL_KERNEL_CACHE", "1")
    return chosen


def _private_folder(path: Path) -> bool:
    """Make ``path`` and the cache folder above it private (0700) where missing; whether both
    are this user's (or root's) and closed to others. A refused cache folder is the warning the
    user cache gives too (one per folder), so the user reads it once."""
    for level in (path.parent, path):
        why = private_folder.make_private_folder(level)
        if why:
            private_folder.warn_refused(level, why, instead="compiled programs are kept in memory only, and PoCL "
                                        "uses its own default cache (set POCL_CACHE_DIR to a folder of yours)")
            return False
    return True
