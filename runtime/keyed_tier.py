"""A cache tier over any store of bytes by name: a folder, a key-value server, an object store.

Subclass :class:`KeyedTier` with ``load(name)`` and ``save(name, data)`` (and ``remove``,
``searched``, ``lease``, ``close`` where the store has them). The name is the program key's
digest (:func:`~kdbkit.runtime.program_key.program_key`, for the local compiler, as the user
cache keys), a 64-character hex string that every machine computes alike for the same program;
the data is the binary sealed in an envelope that binds it to that key. Nothing a store returns
is loaded unless its envelope names the key asked for and its hash matches, so a store that
mixes up names, truncates or corrupts is refused (one warning per key, and a miss), never run.

Envelope layout (version 1, :data:`ENVELOPE_MAGIC`): the magic (8 bytes), the key's digest
(64 ASCII hex bytes), SHA-256 over that digest followed by the binary (32 bytes), the binary.
"""

from __future__ import annotations

import hashlib
import time
from abc import abstractmethod

from kdbkit.runtime.logging_setup import TRACE, get_logger, warn_once
from kdbkit.runtime.program import Step, Steps
from kdbkit.runtime.program_key import ProgramKey, ProgramRequest
from kdbkit.runtime.tier import TierContext, WritableSource

_log = get_logger("runtime.lookup")
ENVELOPE_MAGIC = b"KDBTIER\x01"
_DIGEST_LEN = 64
_HEADER = len(ENVELOPE_MAGIC) + _DIGEST_LEN + 32


def seal(key: str, binary: bytes) -> bytes:
    """``binary`` in an envelope bound to ``key`` (a 64-character hex digest: a program key's, a ranking's)."""
    digest = key.encode("ascii")
    return b"".join((ENVELOPE_MAGIC, digest, hashlib.sha256(digest + binary).digest(), binary))


def unseal(data: bytes, key: str) -> tuple[bytes | None, str]:
    """The binary in ``data`` if its envelope proves it is ``key``'s (a hex digest); else None and why not."""
    if len(data) < _HEADER or not data.startswith(ENVELOPE_MAGIC):
        return None, "it is not a sealed entry"
    start = len(ENVELOPE_MAGIC)
    digest = data[start:start + _DIGEST_LEN]
    if digest != key.encode("ascii"):
        return None, f"it is the entry of another key ({digest[:16].decode('ascii', 'replace')}...)"
    binary = data[_HEADER:]
    if hashlib.sha256(digest + binary).digest() != data[start + _DIGEST_LEN:_HEADER]:
        return None, "its hash does not match its bytes (damaged or truncated)"
    return binary, ""


class EntryRefused(Exception):
    """Raised by ``load`` for data it will not hand over (too large to read): a refusal, not a failure of the store."""


class KeyedTier(WritableSource):
    """A writable tier that keeps sealed binaries in a store of bytes by name.

    Set ``name`` and implement :meth:`load` and :meth:`save`. The handle calls ``attach`` with
    its context before the first lookup; entries are keyed with ``context.key(request)``.
    """

    context: TierContext | None = None

    def attach(self, context: TierContext) -> None:
        self.context = context

    @abstractmethod
    def load(self, name: str) -> bytes | None:
        """The data saved under ``name``, or None. May raise when the store fails (one warning, a miss),
        or :class:`EntryRefused` for data it will not hand over (a refusal)."""

    @abstractmethod
    def save(self, name: str, data: bytes) -> None:
        """Keep ``data`` under ``name``, replacing what was there. May raise (one warning)."""

    def available(self) -> bool:
        """False while the store is known to be down (a miss then counts as an error in the stats)."""
        return True

    def remove(self, name: str) -> None:
        """Forget ``name``'s data: it was refused or does not load (default: nothing; a later save replaces it)."""

    def _key(self, request: ProgramRequest) -> ProgramKey | None:
        return self.context.key(request) if self.context is not None else None

    def get(self, request: ProgramRequest, steps: Steps) -> bytes | None:
        key = self._key(request)
        if key is None:  # no local compiler: nothing to key with, as for the user cache
            return None
        t0 = time.perf_counter()
        try:
            data = self.load(key.digest)  # a store that raises otherwise is read()'s to report
            binary, why = (None, "") if data is None else unseal(data, key.digest)
        except EntryRefused as exc:
            data, binary, why = b"", None, str(exc)
        outcome = ("miss" if self.available() else "unavailable") if data is None else \
            "hit" if binary is not None else "refused"
        steps.append(Step(self.name, (time.perf_counter() - t0) * 1e3, outcome))
        if why:
            warn_once(f"tier-refused:{self.name}:{why.split(' (')[0]}", f"cache tier {self.name} returned an entry for "
                      f"{request} that is not its program: {why}; refusing it", logger=_log)
        if _log.isEnabledFor(TRACE):
            _log.trace("%s %s: %s", self.name, key, outcome)
        return binary

    def put(self, request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
        self.store(key.digest, binary)

    def store(self, digest: str, binary: bytes) -> None:
        """Seal ``binary`` under the key ``digest`` and save it (what a publisher outside a chain calls)."""
        self.save(digest, seal(digest, binary))

    def discard(self, request: ProgramRequest) -> None:
        key = self._key(request)
        if key is not None:
            self.remove(key.digest)
