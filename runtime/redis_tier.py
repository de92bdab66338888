"""The cluster tier: one cache shared by every machine of a cluster, on Redis.

``KDB_REMOTE_CACHE=redis://[user:password@]host:port/db`` puts it after the user cache
(``system, user, remote, jit``). Its entries are :mod:`~kdbkit.runtime.keyed_tier` envelopes under
``kdb:prog:<program key digest>``: the key names the target, the compiler and the sources' digests,
so machines of one GPU share and others never collide, and nothing Redis returns is loaded unless
its envelope proves it is the program asked for (a refusal is one warning and a miss). A remote hit
is written through to the user cache, so a process pays the network once per program.

It never makes a job wait on an outage: connecting and reading time out in milliseconds, and the
first failure switches the tier off for :data:`BACKOFF_S` with one warning (the process goes on
with its local tiers and the JIT), after which it is tried again. A server that refuses writes
(a read-only ACL user: jobs read, builders write) is read all the same, and said once.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit, urlunsplit

from kdbkit.runtime.keyed_tier import KeyedTier
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.tier import SourceCheck

_log = get_logger("runtime.redis_tier")
PREFIX = "kdb:prog:"
CONNECT_TIMEOUT_S = 0.05
READ_TIMEOUT_S = 0.2
BACKOFF_S = 30.0
MAX_ENTRY_BYTES = 64 << 20  # a binary larger than this is not published (Redis keeps values in memory)


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisTier(KeyedTier):
    """The cluster cache on the Redis server at ``url``.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
    """

    name = "remote"
    title = "cluster cache (Redis)"
    immutable = False

    def __init__(self, url: str):
        import redis  # the cluster extra; imported only where a remote cache is configured

        self.url = url
        self._errors = redis.RedisError
        self._denied = (redis.exceptions.NoPermissionError, redis.exceptions.ReadOnlyError)
        self._client = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                            socket_timeout=READ_TIMEOUT_S, retry_on_timeout=False)
        self._off_until = 0.0
        self._may_write = True
        self._lock = threading.Lock()

    def _usable(self) -> bool:
        return time.monotonic() >= self._off_until

    def _switch_off(self, exc: Exception) -> None:
        with self._lock:
            self._off_until = time.monotonic() + BACKOFF_S
        warn_once(f"remote-down:{self.url}:{type(exc).__name__}", f"cluster cache {redacted(self.url)} is not "
                  f"answering ({type(exc).__name__}: {exc}); going on without it for {BACKOFF_S:.0f} s at a time "
                  "(local caches and the JIT serve meanwhile)", logger=_log)

    def load(self, name: str) -> bytes | None:
        if not self._usable():
            return None
        try:
            return self._client.get(PREFIX + name)
        except self._errors as exc:
            self._switch_off(exc)
            return None

    def save(self, name: str, data: bytes) -> None:
        if len(data) <= MAX_ENTRY_BYTES:
            self._write(self._client.set, PREFIX + name, data)

    def remove(self, name: str) -> None:
        self._write(self._client.delete, PREFIX + name)

    def _write(self, command, *args) -> None:
        """Run a writing command, unless this user may not write or the tier is off."""
        if not self._may_write or not self._usable():
            return
        try:
            command(*args)
        except self._denied as exc:
            self._may_write = False
            _log.info("cluster cache %s is read-only for this user (%s): reading only", redacted(self.url), exc)
        except self._errors as exc:
            self._switch_off(exc)

    def searched(self) -> str:
        return f"the cluster cache {redacted(self.url)}"

    def checks(self) -> list[SourceCheck]:
        try:
            self._client.ping()
            reachable = SourceCheck("reachable", "yes", True)
        except self._errors as exc:
            return [SourceCheck("reachable", f"NO ({type(exc).__name__}: {exc})", False)]
        return [reachable, SourceCheck("writable", "yes" if self._may_write else "no (read-only user)", True)]

    def close(self) -> None:
        try:
            self._client.close()
        except self._errors:
            pass
