"""The cluster tier: one cache shared by every machine of a cluster, on Redis.

``KDB_REMOTE_CACHE=redis://[user:password@]host:port/db`` puts it after the user cache
(``system, user, remote, jit``). Its entries are :mod:`~kdbkit.runtime.keyed_tier` envelopes under
``kdb:prog:<program key digest>``: the key names the target, the compiler and the sources' digests,
so machines of one GPU share and others never collide, and nothing Redis returns is loaded unless
its envelope proves it is the program asked for (a refusal is one warning and a miss). A remote hit
is written through to the user cache, so a process pays the network once per program.

Its connection (:mod:`~kdbkit.runtime.redis_link`) never makes a job wait on an outage and
reads a server that refuses this user's writes all the same.
"""

from __future__ import annotations

from kdbkit.runtime.keyed_tier import KeyedTier
from kdbkit.runtime.redis_link import RedisLink
from kdbkit.runtime.tier import SourceCheck

PREFIX = "kdb:prog:"
MAX_ENTRY_BYTES = 64 << 20  # a binary larger than this is not published (Redis keeps values in memory)


class RedisTier(KeyedTier):
    """The cluster cache on the Redis server at ``url``.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
    """

    name = "remote"
    title = "cluster cache (Redis)"
    immutable = False

    def __init__(self, url: str):
        self.link = RedisLink(url)
        self.url = url
        self.too_large = 0  # entries not saved for their size (a publisher reports them)

    def load(self, name: str) -> bytes | None:
        return self.link.get(PREFIX + name)

    def save(self, name: str, data: bytes) -> None:
        if len(data) > MAX_ENTRY_BYTES:
            self.too_large += 1
            return
        self.link.set(PREFIX + name, data)

    def remove(self, name: str) -> None:
        self.link.delete(PREFIX + name)

    def searched(self) -> str:
        return f"the cluster cache {self.link.where}"

    def checks(self) -> list[SourceCheck]:
        try:
            self.link.client.ping()
            writable, why = self.link.probe_write()
        except self.link.errors as exc:
            return [SourceCheck("reachable", f"NO ({type(exc).__name__}: {exc})", False)]
        return [SourceCheck("reachable", "yes", True), SourceCheck("readable", "yes", True),
                SourceCheck("writable", why, True)]

    def close(self) -> None:
        self.link.close()
