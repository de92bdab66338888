"""Compile once per cluster: a lease per program key in Redis, held while one machine compiles.

The first machine to need a program sets ``kdb:lease:<digest>`` if it is absent, with an expiry
(``KDB_REMOTE_LEASE_TTL``), and a thread renews it while the compile runs; it publishes the
binary to the cluster tier before it lets go. Every other machine polls until the lease is gone,
then takes it and re-checks the tiers (:func:`kdbkit.runtime.jit.build_once`), where it finds
the published binary. A holder that dies stops renewing, so its lease expires and the next
waiter compiles; one that stalls alive is waited on for ``KDB_COMPILE_LOCK_WAIT`` only
(:mod:`kdbkit.runtime.lock_wait`); a server that fails or a user that may not write gives no
lease at all. Correctness never depends on it: at worst two machines compile the same program,
and the binaries are checked against their keys wherever they are read.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator

from kdbkit.runtime import env
from kdbkit.runtime.lease import CompileLease
from kdbkit.runtime.lock_wait import wait_for
from kdbkit.runtime.program_key import ProgramKey
from kdbkit.runtime.redis_link import RedisLink

LEASE_PREFIX = "kdb:lease:"
# How often a waiter looks: first every 20 ms (a node starts at most that much after the publish),
# then less often, so that thousands of waiting ranks do not flood one server.
_FIRST_POLL_S, _MOST_POLL_S = 0.02, 0.25


def ttl_s() -> int:
    return env.get_int("KDB_REMOTE_LEASE_TTL") or 10


class RedisLease(CompileLease):
    """The cluster-wide compile lease of the Redis server behind ``link``."""

    def __init__(self, link: RedisLink, published: Callable[[str], str]):
        self.link = link
        self._published = published  # a key digest -> the name its entry is published under

    @contextmanager
    def hold(self, key: ProgramKey) -> Iterator[None]:
        name = LEASE_PREFIX + key.digest
        token = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        ttl_ms = ttl_s() * 1000
        outcome: list[bool | None] = [None]

        poll = [_FIRST_POLL_S]

        def try_take(timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while True:
                outcome[0] = self.link.take(name, token, ttl_ms)
                if outcome[0] is not False:
                    return True  # taken, or no lease to be had: stop waiting
                # The holder published and another waiter holds the lease now: no need to queue
                # behind every waiter, the re-check (without the lease) finds the entry.
                if self.link.read("exists", self._published(key.digest)):
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(poll[0])
                poll[0] = min(_MOST_POLL_S, poll[0] * 1.5)

        wait_for(try_take, program=str(key), lock=f"the cluster lease {name}", holder=lambda: self._holder(name))
        if not outcome[0]:  # the wait's bound passed, or the server cannot give leases: compile without
            yield
            return
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(name, token, ttl_ms, stop), daemon=True,
                                   name="kdb-lease-renewal")
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
            self.link.release(name, token)

    def _renew(self, name: str, token: str, ttl_ms: int, stop: threading.Event) -> None:
        while not stop.wait(ttl_ms / 3000):
            if self.link.renew(name, token, ttl_ms) is False:
                return  # lost: it expired while this process stalled, and someone else may hold it now
            # None: the link is off for now (its back-off); the next renewal tries again

    def _holder(self, name: str) -> str:
        value = self.link.get(name)
        return value.decode("utf-8", "replace") if value else "another machine"
