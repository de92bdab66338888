"""Find once per cluster: find-db rankings shared through the cluster tier's Redis server.

A ranking that find made on one node (:func:`kdbkit.runtime.find.find_solutions`) is published
under ``kdb:rank:<digest>``; immediate mode on another node reads it after its user find-db and
before the system find-dbs (a cluster's ranking was timed on this cluster's own devices), and
writes it through to its user find-db (:class:`~kdbkit.runtime.dispatcher.Dispatcher`). The
connection is the cluster tier's (:class:`~kdbkit.runtime.redis_tier.RedisTier`'s ``link``), so
one outage is one warning and a read-only user reads all the same; a chain without that tier
(no ``KDB_REMOTE_CACHE``, or ``KDB_CACHE_POLICY`` off / installed-only) shares nothing, and a
tier that may not write (``readonly``) reads and publishes nothing.

Key (:func:`ranking_digest`, layout :data:`KEY_SCHEMA`): SHA-256 over labelled, length-prefixed
fields: the key schema, the primitive, the config string, the exact target the find-db is named
for (``sm_90_132``) and the solver-registry version (:func:`registry_version`).

Value: :func:`kdbkit.runtime.keyed_tier.seal` of the payload under that digest, so an entry is
read only if its envelope names the digest asked for and its hash matches. Payload (version
:data:`PAYLOAD_VERSION`, at most :data:`MAX_PAYLOAD_BYTES`), UTF-8 JSON::

    {"v": 1, "config": str, "target": str, "registry": str,
     "records": [[solver_id, solver_name, rank, time_ms, workspace], ...]}

with 1 to :data:`MAX_RECORDS` records, ranks 0, 1, ... in order, distinct solver ids. Anything
else is refused: a miss, counted in :attr:`SharedRankings.refused`, with one warning per reason
(a planted value must not make a job crash or choose from a forged list). A ranking that names a
solver this kdbkit lacks passes here and is skipped by :func:`kdbkit.runtime.immediate.ranked`,
as for a local one.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from typing import TYPE_CHECKING, Sequence

from kdbkit.kdb.version import __version__
from kdbkit.kdb.find_db import FindRecord
from kdbkit.runtime import keyed_tier, tier_stats
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.solver import REGISTRY

if TYPE_CHECKING:
    from kdbkit.runtime.problem import Problem
    from kdbkit.runtime.redis_tier import RedisTier

_log = get_logger("runtime.redis_tier")
PREFIX = "kdb:rank:"
KEY_SCHEMA = 1
PAYLOAD_VERSION = 1
MAX_PAYLOAD_BYTES = 64 << 10  # a primitive has a handful of solvers: a ranking is a few hundred bytes
MAX_RECORDS = 256
MAX_NAME_CHARS = 128
_INT_LIMIT = 1 << 63  # SQLite's INTEGER: a larger value would fail the write-through to the user find-db
_ENVELOPE_BYTES = 4096  # room for the envelope's header (and a signature) around the payload
MAX_VALUE_BYTES = MAX_PAYLOAD_BYTES + _ENVELOPE_BYTES  # a larger value is refused, read no further than one byte past
_FIELDS = ("v", "config", "target", "registry", "records")


def _prefixed(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(8, "little") + data


def registry_version(primitive: str) -> str:
    """The version of ``primitive``'s solvers, as a ranking's key takes it.

    Nothing else identifies a solver registry, so it is derived from what a ranking depends on:
    SHA-256 (first 16 hex digits) over kdbkit's version and the sorted ``id:name`` of every solver
    registered for ``primitive``. The version is in because a release changes solvers' kernels
    under the same names, and a ranking timed on other kernels is not this node's (as the user
    find-db, which lives in a folder per version); a node with a solver more or less finds for
    itself (a ranking without its new solver would never choose it).
    """
    ids = sorted(f"{s.id}:{s.name}" for s in REGISTRY.for_primitive(primitive))
    return hashlib.sha256("\n".join([f"kdbkit {__version__}", *ids]).encode()).hexdigest()[:16]


def ranking_digest(*, primitive: str, config: str, target: str, registry: str) -> str:
    """The 64-hex digest a ranking is stored under, the one function that makes it.

    Args:
        primitive: the problem's primitive (a convolution's config string does not name it).
        config: the problem's config string, as the find-db keys it.
        target: the exact target the find-db file is named for (``sm_90_132``).
        registry: :func:`registry_version` of the primitive's solvers.

    (Also mixed in: :data:`KEY_SCHEMA`, this layout's version.)
    """
    fields = ("schema", str(KEY_SCHEMA), "primitive", primitive, "config", config, "target", target,
              "registry", registry)
    return hashlib.sha256(b"".join(map(_prefixed, fields))).hexdigest()


def encode(config: str, target: str, registry: str, records: Sequence[FindRecord]) -> bytes:
    """The payload of a ranking (see the module's docstring)."""
    rows = [[r.solver_id, r.solver, rank, r.time_ms, r.workspace] for rank, r in enumerate(records)]
    payload = {"v": PAYLOAD_VERSION, "config": config, "target": target, "registry": registry, "records": rows}
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


class Refused(ValueError):
    """A value that is not a ranking of the problem asked for. Its message is one clause, the
    details after it in parentheses (the clause alone keys the one warning per reason)."""


def _reject_constant(name: str):
    raise ValueError(f"it holds {name}")  # NaN and Infinity: JSON has no such numbers


def _is_int(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < _INT_LIMIT


def decode(binary: bytes, config: str, target: str, registry: str) -> list[FindRecord]:
    """The records of a payload that is ``config``'s ranking for ``target`` and ``registry``.

    Raises:
        Refused: anything else (too large, not JSON, another problem's, a malformed record).
    """
    if len(binary) > MAX_PAYLOAD_BYTES:
        raise Refused(f"it is too large ({len(binary)} bytes, more than {MAX_PAYLOAD_BYTES})")
    try:
        payload = json.loads(binary.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Refused(f"it is not a ranking's JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or sorted(payload) != sorted(_FIELDS) or payload["v"] != PAYLOAD_VERSION:
        raise Refused("it is not a version-1 ranking")
    if (payload["config"], payload["target"], payload["registry"]) != (config, target, registry):
        raise Refused("it is the ranking of another problem, target or solver registry")
    rows = payload["records"]
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_RECORDS:
        raise Refused(f"its records are not a list of 1 to {MAX_RECORDS}")
    records, ids = [], set()
    for at, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 5):
            raise Refused(f"a record is not [solver id, solver, rank, time, workspace] (record {at})")
        solver_id, name, rank, time_ms, workspace = row
        if not (_is_int(solver_id) and isinstance(name, str) and 0 < len(name) <= MAX_NAME_CHARS
                and rank == at and _is_int(rank) and _is_int(workspace)
                and isinstance(time_ms, (int, float)) and not isinstance(time_ms, bool)
                and math.isfinite(time_ms) and time_ms >= 0):
            raise Refused(f"a record is malformed (record {at})")
        if solver_id in ids:
            raise Refused(f"a solver is ranked twice (record {at}, solver {solver_id})")
        ids.add(solver_id)
        records.append(FindRecord(solver_id, name, rank, float(time_ms), workspace))
    return records


class SharedRankings:
    """The rankings of one target shared through a cluster tier's connection.

    Args:
        tier: the handle's cluster tier (its ``link`` is used, its ``writable`` says whether
            this process publishes: ``KDB_CACHE_POLICY=readonly`` makes it False).
        target: the exact target the find-db is named for (``sm_90_132``).

    Counters (read by tests and tools): ``hits``, ``misses``, ``refused``, ``published``, ``errors`` (the server out of reach).
    """

    def __init__(self, tier: "RedisTier", target: str):
        self.tier = tier
        self.link = tier.link
        self.target = target
        self.hits = self.misses = self.refused = self.published = self.errors = 0
        self._lock = threading.Lock()  # the prefetch worker and the caller may both ask

    def _count(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)
        # kdb cache stats shows them as a tier of their own
        tier_stats.PROCESS.note("rankings", {"refused": "refusals", "published": "puts"}.get(counter, counter))

    # The envelope, in one place each way: signing (a signer when sealing, trusted keys when
    # unsealing, both the tier's) is passed through here and nowhere else.
    def _seal(self, digest: str, payload: bytes) -> bytes:
        return keyed_tier.seal(digest, payload, self.tier.signing.signer)

    def _unseal(self, data: bytes, digest: str) -> tuple[bytes | None, str]:
        return keyed_tier.unseal(data, digest, self.tier.signing.trusted)

    def _fields(self, problem: "Problem") -> tuple[str, str, str]:
        """(config, registry version, digest) of ``problem``'s ranking."""
        config, registry = problem.config(), registry_version(problem.primitive)
        return config, registry, ranking_digest(primitive=problem.primitive, config=config, target=self.target,
                                                registry=registry)

    def load(self, problem: "Problem") -> list[FindRecord] | None:
        """The cluster's ranking of ``problem``, or None: absent, the server out of reach, or
        refused (counted, one warning per reason)."""
        config, registry, digest = self._fields(problem)
        data = self.link.get_capped(PREFIX + digest, MAX_VALUE_BYTES)  # a giant value costs one byte past the cap
        if data is None:
            self._count("misses" if self.link.usable() else "errors")  # an outage is no miss
            return None
        payload, why = ((None, f"it is too large (more than {MAX_VALUE_BYTES} bytes)") if len(data) > MAX_VALUE_BYTES
                        else self._unseal(data, digest))
        try:
            if payload is None:
                raise Refused(why)
            records = decode(payload, config, self.target, registry)
        except Refused as exc:
            self._count("refused")
            reason = str(exc)
            warn_once(f"rank-refused:{self.link.where}:{reason.split(' (')[0]}", f"cluster cache {self.link.where} "
                      f"returned a ranking for {config} that is not its ranking: {reason}; refusing it (the local "
                      "find-db or the heuristic chooses)", logger=_log)
            return None
        self._count("hits")
        return records

    def publish(self, problem: "Problem", records: Sequence[FindRecord]) -> bool:
        """Share ``problem``'s ranking (find just made it); False when this process may not
        write (policy, a read-only user, an outage) or the ranking is too large."""
        if not self.tier.writable or not records or len(records) > MAX_RECORDS:
            return False
        config, registry, digest = self._fields(problem)
        payload = encode(config, self.target, registry, records)
        if len(payload) > MAX_PAYLOAD_BYTES:
            return False
        done = self.link.set(PREFIX + digest, self._seal(digest, payload))
        if done:
            self._count("published")
        return done
