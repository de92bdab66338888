"""What a process's system bundle served last time, made ready again in the background.

A fresh process's first result waits on every program it needs: each is read from the bundle,
decompressed and loaded, each a noticeable share of a small network's first result. Then each
new problem is set up once: its find-db ranking read, its solver chosen, its invoker built
(launch geometry, kernel arguments), Python work that adds up over dozens of problems. The
last handle closed with the same user cache folder noted both in the startup memo, per bundle
file: the programs its system bundle served (section ``programs``), then the problems it ran in
immediate mode (section ``problems``, their config strings), each in the order the caller first
asked for them.

The next handle starts one worker thread, when it is made, that loads those programs and then
sets those problems up, while the caller uploads its weights and builds its graph (SQLite's
reads, zstd's decompression and the driver's module load release the GIL; a caller waiting
on its own uploads does too). The worker only ever reads that bundle: a program it does not
hold, for itself or for a problem's invoker, is left to the caller's lookup chain, never
compiled here. An item the caller asks for while the worker is on it is waited for, not done
twice; one the worker has not reached yet is taken back, done by the caller at once and
skipped by the worker, so a caller that asks in another order than last time never waits
behind the rest of the list.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import weakref
from typing import Callable, Hashable, Iterable

from kdbkit.runtime.errors import OptionsError
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.program_key import ProgramRequest

_log = get_logger(__name__)
SECTION = "programs"  # the startup memo's section: bundle path -> [[kernel file, [options]], ...]
PROBLEMS_SECTION = "problems"  # bundle path -> [config string, ...]
MAX_PROGRAMS = 256  # per bundle: a process that uses more still prefetches its first ones
MAX_PROBLEMS = 512
WAIT_S = 10.0  # the longest the caller waits on the worker for one item before doing it itself
# Below this many memory blocks (sys.getallocatedblocks: numpy, pyopencl and kdbkit with a small
# network come to about 200,000) a full collection is cheap: its cost grows with the objects it walks.
SMALL_PROCESS_BLOCKS = 500_000


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


def remembered_problems(entries: object) -> list[str]:
    """The config strings a memo entry names (parsed by the worker; one that does not parse is
    skipped there); nothing from an entry that is not a list."""
    if not isinstance(entries, list):
        return []
    return list(dict.fromkeys(e for e in entries[:MAX_PROBLEMS] if isinstance(e, str) and e))


class Prefetch:
    """One worker thread that calls ``work`` on each item, in order.

    Args:
        work: makes one item ready (a program request loaded into the chain's memory, a
            problem's choice and invoker kept by the handle); an exception is logged and the
            next item taken.
        items: distinct, in the order the caller is expected to ask for them.
    """

    def __init__(self, work: Callable[[Hashable], object], items: list[Hashable]):
        self._pending = {item: threading.Event() for item in items}
        self._lock = threading.Lock()
        self._current: Hashable | None = None  # the item the worker is on now
        self._taken: set[Hashable] = set()  # asked for by the caller before the worker reached them
        self._caller_started = False  # the caller has asked for something on the list: it is making its calls
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(work, list(self._pending)), name="kdb-prefetch",
                                        daemon=True)
        _running.add(self)
        self._thread.start()

    @property
    def listed(self) -> int:
        """How many items (programs and problems) the worker was given."""
        return len(self._pending)

    @property
    def on_worker(self) -> bool:
        """Whether the calling thread is the worker itself."""
        return threading.current_thread() is self._thread

    def _run(self, work: Callable[[Hashable], object], items: list[Hashable]) -> None:
        for item in items:
            with self._lock:
                skip = self._stop.is_set() or item in self._taken
                if not skip:
                    self._current = item
            try:
                if not skip:
                    work(item)
            except Exception as exc:  # the caller's own lookup or call reports whatever this hides
                _log.debug("prefetch of %s failed: %s", item, exc)
            finally:
                with self._lock:
                    self._current = None
                self._pending[item].set()
        if not (self._stop.is_set() or self._caller_started) and sys.getallocatedblocks() < SMALL_PROCESS_BLOCKS:
            # The objects the work kept (hundreds per problem) make Python's next full
            # collection due in a small process, where the objects it already had were few:
            # one fell into a small ResNet's first forward here, stalling it. Run it now, while the
            # caller is still setting up (uploading its weights); not once it makes its calls,
            # which the collection would stall, nor in a large process (PyTorch's, say), where
            # the work's objects are too few to make one due and one would cost far more.
            gc.collect()

    def wait(self, item: Hashable) -> None:
        """Return once the caller may do ``item`` itself: at once for one the worker does not
        hold or has not reached (it then skips it), else when the worker is done with it."""
        event = self._pending.get(item)
        if event is None or self.on_worker:
            return
        self._caller_started = True
        if event.is_set():
            return
        with self._lock:
            if item != self._current:
                self._taken.add(item)
                return
        event.wait(WAIT_S)

    def close(self) -> None:
        """Skip what is left and wait for the item in hand (before the device is closed)."""
        self._stop.set()
        self._thread.join()
        _running.discard(self)


# Workers of handles never closed: stopped when the interpreter exits, before the device's
# driver is torn down under a load or an allocation still in hand.
_running: "weakref.WeakSet[Prefetch]" = weakref.WeakSet()


@atexit.register
def _stop_running() -> None:
    for worker in list(_running):
        worker.close()
