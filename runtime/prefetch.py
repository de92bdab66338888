"""The programs a process's system bundle served last time, loaded again in the background.

A fresh process's first result waits on every program it needs: each is read from the bundle,
decompressed and loaded, 0.1-1 ms apiece on the lent H100 machine's CPU (BERT-base's six
cost 3.6 ms). SQLite's reads, zstd's decompression and the driver's module load release the
GIL, so a worker thread can do that while the caller's thread sets up its problems, which is
Python. Which programs: those the system bundle served the last handle closed with this user
cache folder, in the order the caller first asked for them (the startup memo's ``programs``
section, per bundle file). The worker starts when the handle is made, so it overlaps whatever
the caller does before its first calls (uploading weights, building its graph) as well as the
calls themselves. It only ever reads that bundle (a program it no longer holds is left to the
lookup chain, never compiled here). A program the caller asks for while the worker is loading
it is waited for, not loaded twice; one the worker has not reached yet is taken back, loaded
by the caller at once and skipped by the worker, so a caller that asks in another order than
last time never waits behind the rest of the list.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from kdbkit.runtime.errors import OptionsError
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)
SECTION = "programs"  # the startup memo's section: bundle path -> [[kernel file, [options]], ...]
MAX_PROGRAMS = 256  # per bundle: a process that uses more still prefetches its first ones
WAIT_S = 10.0  # the longest the caller waits on the worker for one program before loading it itself


def remembered(entries: object) -> list[ProgramRequest]:
    """The requests a memo entry names; nothing from an entry that is not a list of
    [file, [options]] pairs (a damaged memo prefetches nothing, it breaks nothing)."""
    requests: list[ProgramRequest] = []
    if not isinstance(entries, list):
        return requests
    for entry in entries[:MAX_PROGRAMS]:
        if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and all(isinstance(o, str) for o in entry[1])):
            try:
                requests.append(ProgramRequest(entry[0], tuple(entry[1])))
            except OptionsError:
                continue
    return requests


def to_memo(requests: Iterable[ProgramRequest]) -> list[list]:
    return [[r.kernel_file, list(r.options)] for r in list(requests)[:MAX_PROGRAMS]]


class Prefetch:
    """One worker thread that calls ``preload`` on each request, in order.

    Args:
        preload: loads one request into the chain's memory (``LookupChain.preload`` bound to
            the system source); an exception is logged and the next request taken.
        requests: in the order the caller is expected to ask for them.
    """

    def __init__(self, preload: Callable[[ProgramRequest], object], requests: list[ProgramRequest]):
        self._pending = {r: threading.Event() for r in requests}
        self._lock = threading.Lock()
        self._current: ProgramRequest | None = None  # the request the worker is loading now
        self._taken: set[ProgramRequest] = set()  # asked for by the caller before the worker reached them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(preload, list(self._pending)), name="kdb-prefetch",
                                        daemon=True)
        self._thread.start()

    @property
    def listed(self) -> int:
        """How many programs the worker was given."""
        return len(self._pending)

    def _run(self, preload: Callable[[ProgramRequest], object], requests: list[ProgramRequest]) -> None:
        for request in requests:
            with self._lock:
                skip = self._stop.is_set() or request in self._taken
                if not skip:
                    self._current = request
            try:
                if not skip:
                    preload(request)
            except Exception as exc:  # the caller's own lookup reports whatever this hides
                _log.debug("prefetch of %s failed: %s", request, exc)
            finally:
                with self._lock:
                    self._current = None
                self._pending[request].set()

    def wait(self, request: ProgramRequest) -> None:
        """Return once the caller may look ``request`` up itself: at once for one the worker
        does not hold or has not reached (it then skips it), else when its load is done."""
        event = self._pending.get(request)
        if event is None or event.is_set():
            return
        with self._lock:
            if request != self._current:
                self._taken.add(request)
                return
        event.wait(WAIT_S)

    def close(self) -> None:
        """Skip what is left and wait for the program in hand (before the device is closed)."""
        self._stop.set()
        self._thread.join()
