"""The cluster tier: one cache shared by every machine of a cluster, on Redis.

``KDB_REMOTE_CACHE=redis://[user:password@]host:port/db`` puts it after the user cache
(``system, user, remote, jit``). Its entries are :mod:`~kdbkit.runtime.keyed_tier` envelopes under
``kdb:prog:<program key digest>``: the key names the target, the compiler and the sources' digests,
so machines of one GPU share and others never collide, and nothing Redis returns is loaded unless
its envelope proves it is the program asked for (a refusal is one warning and a miss). A remote hit
is written through to the user cache, so a process pays the network once per program.

Its connection (:mod:`~kdbkit.runtime.redis_link`) never makes a job wait on an outage and
reads a server that refuses this user's writes all the same. With ``KDB_REMOTE_SIGNING_KEY`` it
signs what it publishes, and with ``KDB_REMOTE_TRUSTED_KEYS`` it loads only what those keys signed
(:mod:`~kdbkit.runtime.entry_signing`): the right to write the server then no longer decides what
readers run.
"""

from __future__ import annotations

from kdbkit.runtime import entry_signing
from kdbkit.runtime.entry_signing import EntrySigning
from kdbkit.runtime.keyed_tier import EntryRefused, KeyedTier
from kdbkit.runtime.lease import CompileLease
from kdbkit.runtime.redis_lease import RedisLease
from kdbkit.runtime.redis_link import RedisLink
from kdbkit.runtime.tier import SourceCheck

PREFIX = "kdb:prog:"
MAX_ENTRY_BYTES = 64 << 20  # a sealed entry larger than this is neither published nor read (Redis keeps values in memory)


class RedisTier(KeyedTier):
    """The cluster cache on the Redis server at ``url``.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS).
        signing: whether it signs what it publishes and whose entries it loads; None: the
            environment's (:func:`kdbkit.runtime.entry_signing.from_env`), so that a publisher that
            makes its own tier signs as the chain's does.
        timeout_ms: its read time-out (a publisher's or an administrator's may be longer than a
            job's); None: ``KDB_REMOTE_TIMEOUT_MS``.
    """

    name = "remote"
    title = "cluster cache (Redis)"
    immutable = False

    def __init__(self, url: str, signing: EntrySigning | None = None, timeout_ms: int | None = None):
        self.link = RedisLink(url, timeout_ms)
        self.url = url
        self._lease: RedisLease | None = None
        self.signing = entry_signing.from_env() if signing is None else signing
        self.writable = self.signing.publishes  # a signing key that cannot be used: readers would refuse what it wrote
        self.too_large = 0  # entries not saved for their size (a publisher reports them)

    def load(self, name: str) -> bytes | None:
        # At most one byte past the cap is read: a planted giant value costs no node its memory or
        # its network, and is refused as oversized (an empty answer is a missing key).
        data = self.link.get_capped(PREFIX + name, MAX_ENTRY_BYTES)
        if data is not None and len(data) > MAX_ENTRY_BYTES:
            raise EntryRefused(f"it is larger than the {MAX_ENTRY_BYTES >> 20} MiB an entry may hold")
        return data

    def save(self, name: str, data: bytes) -> None:
        if len(data) > MAX_ENTRY_BYTES:
            self.too_large += 1
            return
        self.link.set(PREFIX + name, data)

    def available(self) -> bool:
        return self.link.usable()

    def remove(self, name: str) -> None:
        self.link.delete(PREFIX + name)

    def lease(self) -> CompileLease | None:
        """The cluster-wide compile lease, for a handle that publishes what it compiles (one that
        does not would make the others wait for a binary that never comes)."""
        if not self.writable or not self.link.may_write:
            return None
        if self._lease is None:
            self._lease = RedisLease(self.link, lambda digest: PREFIX + digest)
        return self._lease

    def searched(self) -> str:
        return f"the cluster cache {self.link.where}"

    def checks(self) -> list[SourceCheck]:
        try:
            self.link.client.ping()
        except self.link.errors as exc:
            return [SourceCheck("reachable", f"NO ({type(exc).__name__}: {exc})", False), *self.signing.checks()]
        try:
            self.link.client.getrange(PREFIX + "0" * 64, 0, 0)  # as a lookup reads
            readable = SourceCheck("readable", "yes", True)
        except self.link.errors as exc:  # a user without the read right: every lookup is a miss
            readable = SourceCheck("readable", f"NO ({type(exc).__name__}: {exc})", False)
        try:
            writable = SourceCheck("writable", self.link.probe_write()[1], True)
        except self.link.errors as exc:
            writable = SourceCheck("writable", f"NO ({type(exc).__name__}: {exc})", True)
        return [SourceCheck("reachable", "yes", True), readable, writable, *self.signing.checks()]

    def close(self) -> None:
        self.link.close()
