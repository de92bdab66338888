"""Who may write the folders and files kdbkit loads binaries from, and making them private.

A binary kdbkit loads runs on the device, and a PoCL binary is native code on the CPU: so a
folder it reads binaries from must be writable by no one but the user who runs them (or root,
who can write anything anyway). A folder or file is trusted when its owner is this process's
effective user or root and neither its group nor others may write it. Folders and files
kdbkit makes are private (folders 0700, files 0600) whatever the umask
(:mod:`kdbkit.kdb.private_files`, which the find-db uses too).

A refusal is a message saying what is wrong and the command that fixes it; the caller warns
once and goes on without the folder (in memory, or the next tier).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# make_file_private is the runtime's through this module too
from kdbkit.kdb.private_files import make_file_private, make_private_folders  # noqa: F401
from kdbkit.runtime.logging_setup import get_logger, warn_once

_log = get_logger(__name__)
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def untrusted(path: Path, st: os.stat_result | None = None) -> str | None:
    """Why ``path`` (a folder or file) may hold what someone else wrote, or None if it is safe.

    Args:
        path: the folder or file.
        st: its ``os.stat`` if the caller has it.

    Returns:
        The reason with the fix, or None when the owner is this user or root and neither
        group nor others may write it. A path that cannot be stat-ed is None: the caller's
        own open reports that.
    """
    try:
        st = st or os.stat(path)
    except OSError:
        return None
    fix_mode = "700" if stat.S_ISDIR(st.st_mode) else "600"
    if not _trusted_owner(st.st_uid):
        return (f"{path} is owned by another user (uid {st.st_uid}), who could plant binaries in it; "
                f"remove it or take it with `chown {os.geteuid()} {path} && chmod {fix_mode} {path}`")
    if st.st_mode & _OTHERS_WRITE:
        return (f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):03o}), who could plant "
                f"binaries in it; make it private with `chmod {fix_mode} {path}`")
    return None


def unsearchable(folder: Path) -> str | None:
    """Why ``folder``, which exists, cannot be listed and entered by this process, or None."""
    if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):
        return (f"{folder} cannot be read (mode {stat.S_IMODE(folder.stat().st_mode):03o}); "
                f"make it yours with `chmod 700 {folder}`")
    return None


def make_private_folder(folder: Path) -> str | None:
    """Make ``folder`` and any missing parent 0700 (each level made here, whatever the umask),
    then check the folder is trusted and usable.

    Returns:
        None when the folder is ready, else why it is not (with the fix).
    """
    try:
        make_private_folders(folder)
    except OSError as exc:
        return f"cannot create {folder} ({exc.strerror or exc})"
    return check_folder(folder)


def check_folder(folder: Path) -> str | None:
    """Why an existing ``folder`` must not be used (not a folder, untrusted, unsearchable), or None."""
    try:
        st = os.stat(folder)
    except OSError as exc:
        return f"cannot reach {folder} ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    return untrusted(folder, st) or unsearchable(folder)


def warn_refused(folder: Path, why: str, *, instead: str = "compiled programs are kept in memory only") -> None:
    """Warn once per folder that kdbkit does not use it (every user of the folder shares the
    warning: the user cache, PoCL's cache and the startup memo in it say it once together)."""
    warn_once(f"unsafe-folder:{folder}", f"Not using {folder}: {why}. Running without it: {instead}; or set "
              "KDB_CUSTOM_CACHE_DIR to a folder of yours.", logger=_log)
