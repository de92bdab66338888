"""Write-through off the lookup's path: in order, drained by close, a failing write costs only itself."""

from __future__ import annotations

import threading

from kdbkit.runtime.write_behind import WriteBehind


def test_writes_run_in_order_off_the_callers_thread_and_close_drains_them():
    writes, threads, gate = [], set(), threading.Event()
    behind = WriteBehind()
    behind.submit(gate.wait)  # the first write is slow: the caller does not wait for it
    for i in range(50):
        behind.submit(lambda i=i: (writes.append(i), threads.add(threading.current_thread().name)))
    assert writes == []
    gate.set()
    behind.close()
    assert writes == list(range(50)) and threads == {"kdb-write-through"}


def test_a_write_that_raises_loses_only_itself_and_flush_waits():
    writes = []
    behind = WriteBehind()
    behind.submit(lambda: 1 / 0)
    behind.submit(lambda: writes.append("next"))
    behind.flush()
    assert writes == ["next"]
    behind.close()
    behind.close()  # twice is harmless
    behind.flush()  # and so is a flush with no thread
