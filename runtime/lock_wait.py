"""Waiting for a compile lock someone else holds: with progress in the log, and a bound.

A holder that stalls (a hung compiler, a process stopped in a debugger) must not stop every
process that needs the same program, and the lock only saves work: past the bound
(``KDB_COMPILE_LOCK_WAIT`` seconds) the waiter compiles the program itself, and both write the
same binary under the same key, which the user cache accepts twice. While it waits, the trace
log (level 7, ``TRACE``) says who holds the lock and for how long, and a warning names the
program and the lock once the wait is long enough to be noticed.
"""

from __future__ import annotations

import time
from typing import Callable

from kdbkit.runtime import env
from kdbkit.runtime.logging_setup import TRACE, get_logger

_log = get_logger(__name__)
WARN_AFTER_S = 10.0  # a wait this long is worth a warning; shorter ones are ordinary contention
_POLL_S = 0.5  # how often the waiter looks again: the trace line, the warning and the bound are as late as this


def wait_bound() -> float:
    """Seconds to wait for a lock before compiling anyway: ``KDB_COMPILE_LOCK_WAIT``."""
    value = env.get_int("KDB_COMPILE_LOCK_WAIT")
    return float(value if value is not None else 30)


def wait_for(try_acquire: Callable[[float], bool], *, program: str, lock: str,
             holder: Callable[[], str] = lambda: "another compile") -> bool:
    """Take a lock through ``try_acquire(timeout_s) -> taken``, logging the wait; give up past
    :func:`wait_bound`.

    Args:
        program: the program the lock is for, as the log names it.
        lock: the lock, as the log names it (a lock file's path, "this process's thread lock").
        holder: who holds it now and since when, for the log.

    Returns:
        Whether the lock was taken; False means the bound passed and the caller goes on without it.
    """
    if try_acquire(0.0):
        return True
    bound, start = wait_bound(), time.monotonic()
    warn_after, warned = min(WARN_AFTER_S, bound / 2), False
    while True:
        waited = time.monotonic() - start
        if waited >= bound:
            _log.warning("gave up waiting for the compile lock of %s (%s, held by %s) after %.0f s; compiling it "
                         "here as well (KDB_COMPILE_LOCK_WAIT sets the wait)", program, lock, holder(), waited)
            return False
        if _log.isEnabledFor(TRACE):  # holder() may ask a server: only when the line is written
            _log.trace("waiting for the compile lock of %s (%s): held by %s, waited %.1f s of %.0f s",
                       program, lock, holder(), waited, bound)
        if not warned and waited >= warn_after:
            warned = True
            _log.warning("waiting for the compile lock of %s (%s, held by %s) for %.0f s; compiling it here if "
                         "it is still held after %.0f s", program, lock, holder(), waited, bound)
        if try_acquire(max(0.0, min(_POLL_S, bound - waited))):
            return True
