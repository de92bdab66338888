"""kdb/signing.py with real Ed25519 keys: pairs written and read back, signatures checked against
the keys trusted, and every key file it must not use refused with the file and the fix."""

from __future__ import annotations

import hashlib
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kdbkit.kdb import signing
from kdbkit.kdb.errors import KdbError, SigningKeyError


@pytest.fixture
def pair(tmp_path):
    key_path, pub_path, signer = signing.write_key_pair(tmp_path / "keys")
    return key_path, pub_path, signer


def test_a_pair_written_reads_back_with_one_key_id_and_private_modes(pair):
    key_path, pub_path, signer = pair
    assert (key_path.name, pub_path.name) == ("kdb-signing.key", "kdb-signing.pub")
    assert os.stat(key_path).st_mode & 0o777 == 0o600
    assert os.stat(key_path.parent).st_mode & 0o777 == 0o700
    loaded, public = signing.load_signer(key_path), signing.load_public_key(pub_path)
    assert loaded.key_id == public.key_id == signer.key_id
    assert public.key_id == hashlib.sha256(public.raw).hexdigest()[:16] and len(public.raw) == 32
    assert "PRIVATE" not in repr(loaded) + repr(public)  # a key never shows in a message


def test_verify_names_the_key_that_signed_and_nothing_else(pair):
    _, pub_path, signer = pair
    trusted = signing.load_public_key(pub_path)
    other = signing.generate().public_key
    signature = signer.sign(b"message")
    assert len(signature) == signing.SIGNATURE_BYTES
    assert signing.verify(b"message", signature, [other, trusted]) is trusted
    assert signing.verify(b"message", signature, [other, trusted], key_id=trusted.key_id) is trusted
    assert signing.verify(b"message", signature, [trusted], key_id=other.key_id) is None
    assert signing.verify(b"messagE", signature, [trusted]) is None
    assert signing.verify(b"message", signature, [other]) is None
    assert signing.verify(b"message", signature, []) is None
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert signing.verify(b"message", flipped, [trusted]) is None
    assert signing.verify(b"message", signature[:-1], [trusted]) is None  # a short one never raises


def test_an_existing_pair_is_never_replaced(pair):
    key_path, pub_path, _ = pair
    before = key_path.read_bytes(), pub_path.read_bytes()
    with pytest.raises(SigningKeyError, match="exists already"):
        signing.write_key_pair(key_path.parent)
    pub_path.unlink()  # the public half alone missing: the private key is still not replaced
    with pytest.raises(SigningKeyError, match="kdb-signing.key exists already"):
        signing.write_key_pair(key_path.parent)
    assert key_path.read_bytes() == before[0]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660])
def test_a_private_key_other_users_can_read_or_write_is_refused_with_the_chmod(pair, mode):
    key_path, _, _ = pair
    os.chmod(key_path, mode)
    with pytest.raises(SigningKeyError) as caught:
        signing.load_signer(key_path)
    assert f"mode {mode:04o}" in caught.value.problem and f"chmod 600 {key_path}" in caught.value.remedy
    os.chmod(key_path, 0o400)  # read-only for its owner is fine
    assert signing.load_signer(key_path).key_id


def test_a_public_key_other_users_can_write_is_refused(pair):
    _, pub_path, _ = pair
    os.chmod(pub_path, 0o666)
    with pytest.raises(SigningKeyError, match="may be written by other users"):
        signing.load_public_key(pub_path)


def _private(tmp_path, data: bytes):
    path = tmp_path / "bad.key"
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def _ec_pem(private: bool) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    if private:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _encrypted_ed25519() -> bytes:
    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"))


@pytest.mark.parametrize("data, said", [
    (b"", "holds no PEM private key"),
    (b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n", "is not a PEM private key"),
    (None, "is not an Ed25519 private key (it is EC)"),
    ("encrypted", "is encrypted"),
    (b"x" * (signing.MAX_KEY_FILE_BYTES + 1), "larger than any key file"),
], ids=["empty", "garbage", "ec", "encrypted", "huge"])
def test_private_key_files_that_cannot_be_used_say_why_and_what_to_do(tmp_path, data, said):
    data = _ec_pem(True) if data is None else _encrypted_ed25519() if data == "encrypted" else data
    with pytest.raises(SigningKeyError) as caught:
        signing.load_signer(_private(tmp_path, data))
    assert said in caught.value.problem and caught.value.remedy
    assert isinstance(caught.value, KdbError) and str(tmp_path) in caught.value.problem


def test_missing_and_folder_key_files_are_refused(tmp_path, pair):
    with pytest.raises(SigningKeyError, match="no private key file"):
        signing.load_signer(tmp_path / "absent.key")
    with pytest.raises(SigningKeyError, match="no public key file"):
        signing.load_public_key(tmp_path / "absent.pub")
    with pytest.raises(SigningKeyError, match="is not a file"):
        signing.load_public_key(tmp_path)


def test_public_key_files_that_cannot_be_used_say_why(tmp_path, pair):
    key_path, pub_path, _ = pair
    with pytest.raises(SigningKeyError, match="holds a private key"):
        signing.load_public_key(key_path)  # the usual mix-up: the .key given where the .pub goes
    ec_pub = tmp_path / "ec.pub"
    ec_pub.write_bytes(_ec_pem(False))
    with pytest.raises(SigningKeyError, match=r"not an Ed25519 public key \(it is EC\)"):
        signing.load_public_key(ec_pub)
    garbage = tmp_path / "garbage.pub"
    garbage.write_bytes(b"ssh-ed25519 AAAA... user@host\n")
    with pytest.raises(SigningKeyError, match="is not a PEM public key"):
        signing.load_public_key(garbage)
    with pytest.raises(SigningKeyError, match="garbage.pub"):  # the first bad one of a list is named
        signing.load_public_keys([pub_path, garbage])
    assert [k.key_id for k in signing.load_public_keys([pub_path, pub_path])] == [pair[2].key_id] * 2
