"""Whether a keyed tier signs what it publishes and which signers it trusts, from the environment.

``KDB_REMOTE_SIGNING_KEY`` names the private key of a machine that publishes (a builder): every
entry it writes is signed. ``KDB_REMOTE_TRUSTED_KEYS`` lists the public keys a reader trusts:
an entry none of them signed, unsigned ones included, is refused (a miss, and the JIT compiles).
A machine that trusts keys but signs with none only reads. A setting that cannot be read is one
warning and the safe side, never a traceback: a signing key that does not load stops publishing
(readers that expect signed entries would refuse unsigned ones anyway), and trusted keys that do
not load make the tier serve nothing, since the user asked for signed entries only and kdbkit
cannot tell which signers were meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import env
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.tier import SourceCheck

if TYPE_CHECKING:
    from kdbkit.kdb.signing import PublicKey, Signer

_log = get_logger("runtime.redis_tier")


@dataclass(frozen=True)
class EntrySigning:
    """What a tier does about signatures.

    Attributes:
        signer: signs every entry the tier publishes; None: entries are published unsigned.
        trusted: None: any entry whose hash checks is loaded; else only entries one of these keys
            signed (empty: none at all, the fail-closed state of unreadable trusted keys).
        publishes: False where a signing key was set but cannot be read, or where keys are trusted
            but none signs: nothing is published.
        signer_problem, trust_problem: why a setting could not be read, for ``kdb doctor``.
    """

    signer: "Signer | None" = None
    trusted: "tuple[PublicKey, ...] | None" = None
    publishes: bool = True
    signer_problem: str = ""
    trust_problem: str = ""

    def checks(self) -> list[SourceCheck]:
        """``kdb doctor``'s lines: whether the tier signs (with which key) and whom it trusts."""
        if self.signer_problem:
            signs = SourceCheck("signs", f"NO: {self.signer_problem}; publishing nothing", False)
        elif self.signer is not None:
            signs = SourceCheck("signs", f"yes, key {self.signer.key_id} ({self.signer.source})")
        elif self.trusted is not None:
            signs = SourceCheck("signs", "no (KDB_REMOTE_SIGNING_KEY unset): publishing nothing, as readers that "
                                "trust keys refuse unsigned entries")
        else:
            signs = SourceCheck("signs", "no (KDB_REMOTE_SIGNING_KEY unset)")
        if self.trust_problem:
            trusts = SourceCheck("trusts", f"NOTHING: {self.trust_problem}; every entry refused", False)
        elif self.trusted is not None:
            trusts = SourceCheck("trusts", "entries signed by key " + ", ".join(k.key_id for k in self.trusted)
                                 + " only")
        else:
            trusts = SourceCheck("trusts", "any entry sealed to its key (KDB_REMOTE_TRUSTED_KEYS unset)")
        return [signs, trusts]


UNSIGNED = EntrySigning()


def from_env() -> EntrySigning:
    """The signing settings of ``KDB_REMOTE_SIGNING_KEY`` and ``KDB_REMOTE_TRUSTED_KEYS``.

    Never raises: a key that cannot be read is one warning (per file and reason, once a process)
    and the safe side described in the module's docstring.
    """
    key_path = env.get_path("KDB_REMOTE_SIGNING_KEY")
    trusted_paths = env.get_pathlist("KDB_REMOTE_TRUSTED_KEYS")
    signer, signer_problem, trusted, trust_problem = None, "", None, ""
    if key_path is not None:
        signer, signer_problem = _load(lambda s: s.load_signer(key_path), "KDB_REMOTE_SIGNING_KEY",
                                       "the cluster cache is read, but nothing is published to it")
    if trusted_paths:
        trusted, trust_problem = _load(lambda s: s.load_public_keys(trusted_paths), "KDB_REMOTE_TRUSTED_KEYS",
                                       "the cluster cache serves nothing (only signed entries were asked for, and "
                                       "it is not known whose signatures to accept)")
        trusted = () if trust_problem else trusted
    # A machine that trusts keys but has no signing key of its own only reads: its unsigned entries
    # would be refused by every reader like it, and each one would replace an entry it refused
    # (with its trusted keys unreadable: every signed entry of the cluster, one compile at a time).
    publishes = not signer_problem and (signer is not None or trusted is None)
    return EntrySigning(signer, trusted, publishes, signer_problem, trust_problem)


def _load(load, setting: str, consequence: str):
    """``load(kdbkit.kdb.signing)`` and "", or None and the problem, said once as a warning."""
    try:
        from kdbkit.kdb import signing  # imported only where a key is configured (it loads cryptography)

        return load(signing), ""
    except ImportError as exc:  # an install without its dependencies
        problem, remedy = f"the cryptography package does not import ({exc})", "pip install cryptography"
    except KdbError as exc:  # SigningKeyError
        problem, remedy = exc.problem, exc.remedy
    warn_once(f"entry-signing:{setting}:{problem}", f"{setting} cannot be used: {problem}; {consequence}; {remedy}",
              logger=_log)
    return None, f"{problem}; {remedy}"
