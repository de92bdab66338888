"""Writing a lower tier's hit through to the tiers above it, off the lookup's path.

A cluster-cache hit is stored in the user cache so that the next process pays the network no
more; storing costs a SQLite write (the first one makes the file), which the program's caller
need not wait for: the program is already loaded and in memory. One daemon thread per chain
does the writes in order; ``close`` waits for what is queued (a handle's close), and a process
that exits without closing loses only queued writes, each in its own SQLite transaction, so
nothing half-written is ever kept: the next process finds the program in the cluster again.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

_STOP = object()


class WriteBehind:
    """Runs submitted writes, in order, on one background thread made on first use."""

    def __init__(self, name: str = "kdb-write-through"):
        self._name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def submit(self, work: Callable[[], None]) -> None:
        """Queue ``work`` (which must not raise: tier writes warn and go on by themselves)."""
        if self._thread is None:
            with self._guard:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        self._queue.put(work)

    def _run(self) -> None:
        while (work := self._queue.get()) is not _STOP:
            try:
                work()
            except Exception:  # a write that raises loses only its entry; the next ones still go
                pass

    def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done.set)
            done.wait()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._guard:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()
