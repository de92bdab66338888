"""Ctrl-C in ``kdb``: the first one interrupts the command (which cleans up, prints one
"aborted" line and exits 130); a second one, while that cleanup runs, exits 130 at once.

Python's own handler raises KeyboardInterrupt again for a second Ctrl-C, wherever the first
one's cleanup happens to be (joining threads, terminating workers), and that traceback is
what the user sees last. Installed only by :func:`kdbkit.runtime.cli.app.main`, in the main
thread, and only where SIGINT still has Python's default handler (an embedding program's own
handler is left alone); the previous handler is restored when the command returns.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


_interrupted = False


def interrupted() -> bool:
    """Whether a Ctrl-C reached :func:`handled`'s block (typer turns one into a silent exit 130)."""
    return _interrupted


def _first(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    signal.signal(signal.SIGINT, _second)
    raise KeyboardInterrupt


def _second(signum, frame) -> None:
    os._exit(EXIT_INTERRUPTED)  # no unwinding: nothing left to print a traceback


@contextmanager
def handled() -> Iterator[None]:
    """Ctrl-C handled as the module docstring says, for the ``with`` block; after a Ctrl-C, a
    second one still exits at once (the interpreter's own shutdown is cleanup too)."""
    global _interrupted
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _interrupted = False
    signal.signal(signal.SIGINT, _first)
    try:
        yield
    finally:
        if not _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
