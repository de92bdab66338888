"""Making the folders and files kdbkit writes private (folders 0700, files 0600) whatever the
umask: ``mkdir``'s mode is masked by the umask and its parents get the default mode, so every
level made here is chmod-ed explicitly. Here, below the runtime, so that the find-db (``kdb``)
and the runtime's caches make them alike; who may be trusted is the runtime's
(``runtime/private_folder.py``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def make_private_folders(folder: Path) -> None:
    """Make ``folder`` and any missing parent, each level 0700.

    Raises:
        OSError: a level cannot be made.
    """
    missing = []
    probe = folder
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for level in reversed(missing):
        try:
            os.mkdir(level, FOLDER_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: the caller checks it like any existing folder
        os.chmod(level, FOLDER_MODE)


def make_file_private(path: Path) -> None:
    """Give a file this process made mode 0600 (SQLite creates its files with the umask's mode,
    and its ``-wal``/``-shm`` with the main file's); a file of someone else's is left alone."""
    try:
        st = os.stat(path)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.chmod(path, FILE_MODE)
    except OSError:
        pass  # gone meanwhile, or on a file system without modes: the folder's check still holds
