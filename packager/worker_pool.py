"""The local build's compiler processes, and how a Ctrl-C stops them.

A terminal sends Ctrl-C (SIGINT) to every process of the foreground group: the builder and its
workers. A worker that takes it dies in the middle of the pool's protocol, which leaves the
pool waiting on results that never come (a build that hangs) and prints each worker's
traceback. So workers ignore SIGINT (they start with it blocked, so that none is caught between
its start and its initializer), and the builder alone reacts: :func:`stop` cancels what has not
started and terminates the workers, and the caller re-raises the interrupt.
"""

from __future__ import annotations

import concurrent.futures
import signal
from contextlib import contextmanager
from typing import Iterable, Iterator

_STOP_WAIT_S = 1.0  # a worker given SIGTERM that has not exited by then is killed


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def process_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``workers`` processes that ignore SIGINT; submit to it inside :func:`submitting`."""
    return concurrent.futures.ProcessPoolExecutor(workers, initializer=_ignore_sigint)


@contextmanager
def submitting(executor: concurrent.futures.Executor) -> Iterator[None]:
    """Around the submits to a process pool: SIGINT held back in this thread (a Ctrl-C arrives
    when the block ends), so that the workers the pool starts meanwhile inherit it blocked.
    Nothing for another executor (one that compiles as it is submitted to must stay
    interruptible), nor outside the main thread, the only one Python delivers SIGINT to."""
    import threading

    if not isinstance(executor, concurrent.futures.ProcessPoolExecutor) or \
            threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop(executor: concurrent.futures.Executor, futures: Iterable[concurrent.futures.Future]) -> None:
    """Stop a build's compiles now: terminate a process pool's workers (a compile under way is
    given up, not waited for) and shut the pool down without waiting; another executor (a Dask
    client) is asked to cancel ``futures``, and stays open."""
    if not isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        for future in futures:
            future.cancel()
        return
    # A process pool's futures are left as they are: the pool fails each one that is not done
    # once it sees its workers gone, and one cancelled here would make it raise instead.
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(_STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join(_STOP_WAIT_S)
    executor.shutdown(wait=False)
