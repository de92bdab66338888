"""A cache tier over any store of bytes by name: a folder, a key-value server, an object store.

Subclass :class:`KeyedTier` with ``load(name)`` and ``save(name, data)`` (and ``remove``,
``searched``, ``lease``, ``close`` where the store has them). The name is the program key's
digest (:func:`~kdbkit.runtime.program_key.program_key`, for the local compiler, as the user
cache keys), a 64-character hex string that every machine computes alike for the same program;
the data is the binary sealed in an envelope that binds it to that key. Nothing a store returns
is loaded unless its envelope names the key asked for and its hash matches, so a store that
mixes up names, truncates or corrupts is refused (one warning per key, and a miss), never run.

Envelope layouts. Version 1 (:data:`ENVELOPE_MAGIC`, unsigned): the magic (8 bytes), the key's
digest (64 ASCII hex bytes), SHA-256 over that digest followed by the binary (32 bytes), the
binary. Version 2 (:data:`SIGNED_MAGIC`, signed): the same magic-digest-hash header with the new
magic, then the signer's key id (16 ASCII hex bytes, :func:`kdbkit.kdb.signing.key_id`) and an
Ed25519 signature (64 bytes) over the magic, the digest and the hash, then the binary. The hash
covers the binary and the signature covers the hash, so a signature holds for one key and one
binary. A tier whose :class:`~kdbkit.runtime.entry_signing.EntrySigning` has a signer writes
version 2; one with trusted keys loads only version 2 entries that one of them signed; one with
neither loads both versions once the hash checks.
"""

from __future__ import annotations

import hashlib
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Iterable

from kdbkit.runtime.entry_signing import UNSIGNED, EntrySigning
from kdbkit.runtime.logging_setup import TRACE, get_logger, warn_once
from kdbkit.runtime.program import Step, Steps
from kdbkit.runtime.program_key import ProgramKey, ProgramRequest
from kdbkit.runtime.tier import TierContext, WritableSource

if TYPE_CHECKING:
    from kdbkit.kdb.signing import PublicKey, Signer

_log = get_logger("runtime.lookup")
ENVELOPE_MAGIC = b"KDBTIER\x01"
SIGNED_MAGIC = b"KDBTIER\x02"
_DIGEST_LEN = 64
_HEADER = len(ENVELOPE_MAGIC) + _DIGEST_LEN + 32  # magic, digest, hash: both versions
_KEY_ID_LEN = 16  # kdbkit.kdb.signing.KEY_ID_CHARS (not imported: it loads cryptography)
_SIGNATURE_LEN = 64
_SIGNED_HEADER = _HEADER + _KEY_ID_LEN + _SIGNATURE_LEN


def seal(key: str, binary: bytes, signer: "Signer | None" = None) -> bytes:
    """``binary`` in an envelope bound to ``key`` (a 64-character hex digest: a program key's, a
    ranking's); signed by ``signer`` (version 2) where given, else version 1."""
    digest = key.encode("ascii")
    header = (ENVELOPE_MAGIC if signer is None else SIGNED_MAGIC) + digest + hashlib.sha256(digest + binary).digest()
    if signer is None:
        return header + binary
    return b"".join((header, signer.key_id.encode("ascii"), signer.sign(header), binary))


def unseal(data: bytes, key: str, trusted: "Iterable[PublicKey] | None" = None) -> tuple[bytes | None, str]:
    """The binary in ``data`` if its envelope proves it is ``key``'s (a hex digest); else None and why not.

    Args:
        data: an envelope of either version.
        key: the digest asked for.
        trusted: None: a signature is not required (nor checked); else the entry must be signed by
            one of these keys (an empty collection refuses everything).
    """
    signed = data.startswith(SIGNED_MAGIC)
    end = _SIGNED_HEADER if signed else _HEADER
    if len(data) < end or not (signed or data.startswith(ENVELOPE_MAGIC)):
        return None, "it is not a sealed entry"
    start = len(ENVELOPE_MAGIC)
    digest = data[start:start + _DIGEST_LEN]
    if digest != key.encode("ascii"):
        return None, f"it is the entry of another key ({digest[:16].decode('ascii', 'replace')}...)"
    binary = data[end:]
    if hashlib.sha256(digest + binary).digest() != data[start + _DIGEST_LEN:_HEADER]:
        return None, "its hash does not match its bytes (damaged or truncated)"
    if trusted is None:
        return binary, ""
    if not signed:
        return None, "it is not signed (only entries signed by a trusted key are loaded)"
    key_id = data[_HEADER:_HEADER + _KEY_ID_LEN].decode("ascii", "replace")
    trusted = list(trusted)
    named = [k for k in trusted if k.key_id == key_id]
    if not named:
        return None, f"its signer is not trusted (key {key_id}{'' if trusted else '; no trusted key could be read'})"
    from kdbkit.kdb.signing import verify  # loaded already: the trusted keys are its objects

    if verify(data[:_HEADER], data[_HEADER + _KEY_ID_LEN:end], named) is None:
        return None, f"its signature does not verify (forged or damaged, claiming key {key_id})"
    return binary, ""


class EntryRefused(Exception):
    """Raised by ``load`` for data it will not hand over (too large to read): a refusal, not a failure of the store."""


class KeyedTier(WritableSource):
    """A writable tier that keeps sealed binaries in a store of bytes by name.

    Set ``name`` and implement :meth:`load` and :meth:`save`. The handle calls ``attach`` with
    its context before the first lookup; entries are keyed with ``context.key(request)``.
    """

    context: TierContext | None = None
    signing: EntrySigning = UNSIGNED  # what it signs with and whom it trusts (runtime/entry_signing.py)

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
            binary, why = (None, "") if data is None else unseal(data, key.digest, self.signing.trusted)
        except EntryRefused as exc:
            data, binary, why = b"", None, str(exc)
        outcome = ("miss" if self.available() else "unavailable") if data is None else \
            "hit" if binary is not None else "refused"
        steps.append(Step(self.name, (time.perf_counter() - t0) * 1e3, outcome))
        if why:
            warn_once(f"tier-refused:{self.name}:{why.split(' (')[0]}", f"cache tier {self.name} returned an entry for "
                      f"{request} that cannot be trusted to be its program: {why}; refusing it", logger=_log)
        if _log.isEnabledFor(TRACE):
            _log.trace("%s %s: %s", self.name, key, outcome)
        return binary

    def put(self, request: ProgramRequest, binary: bytes, key: ProgramKey) -> None:
        self.store(key.digest, binary)

    def store(self, digest: str, binary: bytes) -> None:
        """Seal ``binary`` under the key ``digest`` (signed where the tier has a signer) and save it;
        what a publisher outside a chain calls. Nothing is saved where ``signing.publishes`` is
        False (a signing key set but unusable, or keys trusted and none to sign with): readers that
        expect signed entries would refuse an unsigned one."""
        if self.signing.publishes:
            self.save(digest, seal(digest, binary, self.signing.signer))

    def discard(self, request: ProgramRequest) -> None:
        key = self._key(request)
        if key is not None:
            self.remove(key.digest)
