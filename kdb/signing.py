"""Ed25519 signatures for what kdbkit shares between machines: cluster-cache entries, and packages.

A writer holds a private key (PEM PKCS#8, unencrypted, in a file only its owner may read, as ssh
requires of its keys); each reader holds the public keys it trusts (PEM SubjectPublicKeyInfo). A
key is named by its *key id*: the first 16 hex digits of SHA-256 over the raw 32-byte public key,
the same on every machine, short enough for a message or an envelope. Nothing here knows what is
signed: callers choose the message bytes, and must make them cover everything a reader relies on.

Loading a key file that cannot be used raises :class:`~kdbkit.kdb.errors.SigningKeyError` naming
the file and the fix; :func:`verify` never raises. This module imports nothing of the runtime, so
the packager can sign and check packages with it too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kdbkit.kdb.errors import SigningKeyError
from kdbkit.kdb.private_files import make_private_folders

KEY_ID_CHARS = 16  # hex digits: 64 bits, plenty to tell apart the handful of keys a cluster trusts
SIGNATURE_BYTES = 64  # an Ed25519 signature's size, fixed
KEY_NAME = "kdb-signing"  # `kdb keys new` writes KEY_NAME.key and KEY_NAME.pub
PRIVATE_MODE = 0o600
MAX_KEY_FILE_BYTES = 64 << 10  # a PEM Ed25519 key is ~120 bytes: a larger file is no key file
_NEW_PAIR = "make an Ed25519 pair with `kdb keys new -o DIR`"


def key_id(raw_public: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key (16 lower-case hex digits)."""
    return hashlib.sha256(raw_public).hexdigest()[:KEY_ID_CHARS]


@dataclass(frozen=True, eq=False)
class PublicKey:
    """A public key a reader trusts.

    Attributes:
        key_id: see :func:`key_id`.
        raw: the 32 raw key bytes.
        source: where it was loaded from, for messages ("" for one made here).
    """

    key_id: str
    raw: bytes = field(repr=False)
    source: str
    _key: Ed25519PublicKey = field(repr=False)

    @classmethod
    def of(cls, key: Ed25519PublicKey, source: str = "") -> "PublicKey":
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(key_id(raw), raw, source, key)

    def verifies(self, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is this key's over ``message``."""
        try:
            self._key.verify(signature, message)
            return True
        except InvalidSignature:
            return False

    def pem(self) -> bytes:
        return self._key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class Signer:
    """A private key that signs; :attr:`public_key` is what readers are given to trust."""

    def __init__(self, private: Ed25519PrivateKey, source: str = ""):
        self._private = private
        self.source = source
        self.public_key = PublicKey.of(private.public_key(), source)

    @property
    def key_id(self) -> str:
        return self.public_key.key_id

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._private.sign(message)

    def private_pem(self) -> bytes:
        return self._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())

    def __repr__(self) -> str:  # never the key itself
        return f"Signer(key_id={self.key_id!r}, source={self.source!r})"


def generate() -> Signer:
    """A new random key pair."""
    return Signer(Ed25519PrivateKey.generate())


def verify(message: bytes, signature: bytes, trusted_keys: Iterable[PublicKey],
           key_id: str | None = None) -> PublicKey | None:
    """The trusted key whose signature over ``message`` ``signature`` is, or None; never raises.

    Args:
        message: the bytes that were signed.
        signature: the signature to check (any length: a wrong one verifies under no key).
        trusted_keys: the keys to accept.
        key_id: where the signer named itself, only the trusted keys of that id are tried.
    """
    if len(signature) != SIGNATURE_BYTES:
        return None
    for key in trusted_keys:
        if (key_id is None or key.key_id == key_id) and key.verifies(message, signature):
            return key
    return None


def load_signer(path: str | os.PathLike) -> Signer:
    """The private key in ``path`` (PEM PKCS#8, unencrypted, Ed25519, readable by its owner only).

    Raises:
        SigningKeyError: no such file, unreadable, readable or writable by group or others, not
            an unencrypted Ed25519 private key in PEM.
    """
    data = _read(Path(path), private=True)
    if b"PRIVATE KEY" not in data:
        raise SigningKeyError(f"{path} holds no PEM private key", f"point the setting at the .key file; {_NEW_PAIR}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # cryptography: "Password was not given but private key is encrypted"
        raise SigningKeyError(f"the private key {path} is encrypted ({exc})",
                              "kdbkit reads unencrypted keys only: write it out without a passphrase "
                              "(`openssl pkey -in KEY -out NEW`) and keep it mode 0600") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(f"{path} is not a PEM private key kdbkit can read ({exc})", _NEW_PAIR) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path} is not an Ed25519 private key (it is {_kind(key)})", _NEW_PAIR)
    return Signer(key, str(path))


def load_public_key(path: str | os.PathLike) -> PublicKey:
    """The public key in ``path`` (PEM SubjectPublicKeyInfo, Ed25519).

    Raises:
        SigningKeyError: no such file, unreadable, writable by group or others (whoever may replace
            it chooses what is trusted), a private key, or not an Ed25519 public key in PEM.
    """
    data = _read(Path(path), private=False)
    if b"PRIVATE KEY" in data:
        raise SigningKeyError(f"{path} holds a private key, not a public one",
                              "trust the .pub file written beside it; the private key stays on the machines that sign")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(f"{path} is not a PEM public key kdbkit can read ({exc})",
                              "give the .pub file of a pair made with `kdb keys new -o DIR`") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path} is not an Ed25519 public key (it is {_kind(key)})", _NEW_PAIR)
    return PublicKey.of(key, str(path))


def load_public_keys(paths: Iterable[str | os.PathLike]) -> tuple[PublicKey, ...]:
    """Every key in ``paths``, in order.

    Raises:
        SigningKeyError: the first file that cannot be used (see :func:`load_public_key`).
    """
    return tuple(load_public_key(p) for p in paths)


def write_key_pair(folder: str | os.PathLike, name: str = KEY_NAME) -> tuple[Path, Path, Signer]:
    """Make a key pair in ``folder``: ``name.key`` (mode 0600) and ``name.pub``.

    The folder is made (0700) where missing. Neither file is ever replaced: a key that signed what
    readers trust must not vanish under a mistyped command.

    Returns:
        The private key's path, the public key's path, and the new key.
    Raises:
        SigningKeyError: either file exists already.
        OSError: the folder or a file cannot be written.
    """
    folder = Path(folder)
    key_path, pub_path = folder / f"{name}.key", folder / f"{name}.pub"
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise SigningKeyError(f"{path} exists already; kdbkit never replaces a key file",
                                  "choose another folder with -o, or remove the old pair first if nothing signed "
                                  "with it is still trusted")
    make_private_folders(folder)
    signer = Signer(Ed25519PrivateKey.generate(), str(key_path))
    _write_new(key_path, signer.private_pem(), PRIVATE_MODE)
    try:
        _write_new(pub_path, signer.public_key.pem(), 0o644)
    except BaseException:
        key_path.unlink()  # no private key without its public half
        raise
    return key_path, pub_path, signer


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: a file made meanwhile by someone else is not replaced; fchmod: whatever the umask.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def _read(path: Path, private: bool) -> bytes:
    """A key file's bytes, its mode checked on the open file (no swap between check and read)."""
    what = "private key" if private else "public key"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SigningKeyError(f"no {what} file {path}", f"check the path, or {_NEW_PAIR}") from None
    except OSError as exc:
        raise SigningKeyError(f"the {what} file {path} cannot be opened ({exc.strerror})",
                              "give this user read access to it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningKeyError(f"{path} is not a file", f"give the {what} file itself")
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (os.getuid(), 0):  # its owner may rewrite it whatever its mode
            raise SigningKeyError(f"the {what} file {path} belongs to another user (uid {st.st_uid})",
                                  f"keep a copy of your own: cp {path} ~/ && chmod go-w ~/{os.path.basename(path)}")
        if private and mode & 0o077:  # as ssh: a key others could read or replace is not this user's alone
            raise SigningKeyError(f"the private key {path} may be read or written by other users (mode {mode:04o})",
                                  f"run `chmod 600 {path}`; if others may have copied it, make a new pair "
                                  "and stop trusting this one")
        if not private and mode & 0o022:  # whoever may rewrite a trusted key chooses what is loaded
            raise SigningKeyError(f"the public key {path} may be written by other users (mode {mode:04o})",
                                  f"run `chmod go-w {path}`")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise SigningKeyError(f"the {what} file {path} cannot be read ({exc.strerror})",
                              "give this user read access to it") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise SigningKeyError(f"{path} is larger than any key file ({MAX_KEY_FILE_BYTES} bytes read)",
                              f"give the {what} file itself")
    return data


def _kind(key: object) -> str:
    """RSA, EC, Ed448, ...: from the class name cryptography gives each key type."""
    name = type(key).__name__.replace("Private", "").replace("Public", "").replace("Key", "")
    return name.lstrip("_") or type(key).__name__


DETACHED_FORMAT = 1


def detached_signature(signer: Signer, message: bytes) -> bytes:
    """A detached signature file's bytes (``manifest.json.sig``): the key id and the Ed25519
    signature over ``message`` (base64), as JSON in one fixed form, so the same key and message
    give the same bytes (Ed25519 signatures are deterministic)."""
    return (json.dumps({"format": DETACHED_FORMAT, "key_id": signer.key_id,
                        "signature": base64.b64encode(signer.sign(message)).decode()}, indent=1, sort_keys=True)
            + "\n").encode()


def read_detached_signature(data: bytes) -> tuple[str, bytes] | None:
    """The key id and signature a detached signature file holds, or None when its bytes are not
    exactly what :func:`detached_signature` writes (nothing else is accepted); never raises."""
    try:
        parsed = json.loads(data)
        key, sig_text = parsed["key_id"], parsed["signature"]
        signature = base64.b64decode(sig_text, validate=True)
        canonical = (json.dumps({"format": DETACHED_FORMAT, "key_id": key, "signature": sig_text}, indent=1,
                                sort_keys=True) + "\n").encode()
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    if (canonical != data or not isinstance(key, str) or len(key) != KEY_ID_CHARS
            or any(c not in "0123456789abcdef" for c in key) or len(signature) != SIGNATURE_BYTES):
        return None
    return key, signature
