"""``kdb cache ... --remote``: what the cluster cache holds, emptying it, and how its server is set.

Names are listed with SCAN (never KEYS, which blocks a big server) and sized in pipelined
batches; an empty ``clear`` needs the write right, which a job's read-only user lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import env
from kdbkit.runtime.redis_link import RedisLink

KINDS = {"kdb:prog:": "programs", "kdb:rank:": "rankings", "kdb:lease:": "compile leases"}
_BATCH = 500
ADMIN_TIMEOUT_MS = 5000  # an administrator's listing or clearing may wait; a job's lookup may not


class RemoteCacheError(KdbError):
    """The cluster cache cannot be reached or does not allow what was asked."""


@dataclass
class RemoteListing:
    where: str
    counts: dict[str, int] = field(default_factory=dict)  # by kind
    bytes: dict[str, int] = field(default_factory=dict)
    sample: list[tuple[str, int]] = field(default_factory=list)  # the first names and their sizes


def link() -> RedisLink:
    """The link to ``KDB_REMOTE_CACHE``'s server, checked to answer.

    Raises:
        RemoteCacheError: it is not set, not a Redis URL, the client is missing, or the server does not answer.
    """
    url = env.get_str("KDB_REMOTE_CACHE")
    if not url:
        raise RemoteCacheError("no cluster cache is configured", "set KDB_REMOTE_CACHE=redis://host:port/0")
    try:
        made = RedisLink(url, ADMIN_TIMEOUT_MS)
    except ImportError as exc:
        raise RemoteCacheError(f"the cluster cache needs the redis client ({exc})", "pip install 'kdbkit[cluster]'")
    except ValueError:
        raise RemoteCacheError("KDB_REMOTE_CACHE is not a Redis URL", "set it to redis://[user:password@]host:port/db")
    try:
        made.client.ping()
    except made.errors as exc:
        made.close()
        raise RemoteCacheError(f"cluster cache {made.where} does not answer ({type(exc).__name__}: {exc})",
                               "check that the server runs and KDB_REMOTE_CACHE names it "
                               "(KDB_REMOTE_TIMEOUT_MS for a slow network)")
    return made


def _names(made: RedisLink, pattern: str) -> Iterator[bytes]:
    """Names matching ``pattern`` (SCAN, never KEYS, which blocks a big server); a failure raises
    (an administrator must not be told "0 entries" by a server that refused to list them)."""
    cursor = 0
    while True:
        cursor, names = _answered(made, made.client.scan, cursor, pattern, 1000)
        yield from names
        if cursor == 0:
            return


def count_remote(made: RedisLink) -> dict[str, int]:
    """How many names of each kind the server holds (no sizes: one SCAN pass)."""
    return {kind: sum(1 for _ in _names(made, prefix + "*")) for prefix, kind in KINDS.items()}


def list_remote(made: RedisLink, sample: int = 20) -> RemoteListing:
    listing = RemoteListing(made.where)
    for prefix, kind in KINDS.items():
        names = list(_names(made, prefix + "*"))
        sizes: list[int] = []
        for i in range(0, len(names), _BATCH):
            pipe = made.client.pipeline(transaction=False)
            for name in names[i:i + _BATCH]:
                pipe.strlen(name)
            sizes += _answered(made, pipe.execute)
        listing.counts[kind], listing.bytes[kind] = len(names), sum(sizes)
        if kind == "programs":
            listing.sample = [(n.decode("ascii", "replace"), s) for n, s in list(zip(names, sizes))[:sample]]
    return listing


def clear_remote(made: RedisLink) -> int:
    """Delete every program and ranking; returns how many. Compile leases are left to expire.

    Raises:
        RemoteCacheError: this user may not delete (a read-only user), or the server failed.
    """
    removed = 0
    for prefix in ("kdb:prog:", "kdb:rank:"):
        names = list(_names(made, prefix + "*"))
        for i in range(0, len(names), _BATCH):
            removed += _answered(made, made.client.delete, *names[i:i + _BATCH])
    return removed


def server_memory(made: RedisLink) -> dict[str, object]:
    """The server's memory use and eviction settings, or why they cannot be read (a user without INFO)."""
    try:
        info = made.client.info("memory")
    except made.errors as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"used_memory": info.get("used_memory"), "maxmemory": info.get("maxmemory"),
            "maxmemory_policy": info.get("maxmemory_policy")}


def _answered(made: RedisLink, command, *args):
    try:
        return command(*args)
    except made.errors as exc:
        denied = isinstance(exc, made.denied)
        raise RemoteCacheError(f"cluster cache {made.where} refused: {type(exc).__name__}: {exc}",
                               "use a Redis user with the write right (a builder's), not a job's read-only one"
                               if denied else "check the server and try again") from exc
