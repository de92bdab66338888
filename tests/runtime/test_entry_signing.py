"""Signed cluster-cache entries on a real redis-server with real Ed25519 keys: a builder signs what
it publishes, a reader that trusts its key loads only what that key signed (an unsigned, forged,
re-signed or altered entry is refused and compiled over), key files that cannot be used are one
warning and the safe side, and ``kdb keys new`` makes the pair."""

from __future__ import annotations

import os

import pytest

from kdbkit.kdb import signing
from kdbkit.runtime import entry_signing
from kdbkit.runtime.keyed_tier import ENVELOPE_MAGIC, SIGNED_MAGIC, seal, unseal
from kdbkit.runtime.redis_tier import PREFIX, RedisTier
from kdbkit.runtime.samples import SAMPLES
from tests.runtime.redis_server import server  # noqa: F401 (server: a fixture)

pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
RELU = SAMPLES[0]
DIGEST = "ab" * 32
SIGNATURE_AT = len(SIGNED_MAGIC) + 64 + 32 + 16  # magic, digest, hash, key id: then the signature
BINARY_AT = SIGNATURE_AT + 64


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two pairs: the cluster's builder key (trusted by readers) and a stranger's."""
    folder = tmp_path_factory.mktemp("keys")
    builder, stranger = signing.write_key_pair(folder / "builder"), signing.write_key_pair(folder / "stranger")
    return {"builder": builder, "stranger": stranger}


@pytest.fixture
def node(isolated, make_handle, monkeypatch, server, keys, fresh_log):
    """A handle of a "node": its own user cache, the shared cluster cache, and its signing settings:
    ``signs`` the pair whose private key it signs with, ``trusts`` the pairs whose public keys it trusts
    (or paths, for files that cannot be used)."""
    server.client().flushdb()
    count = iter(range(100))

    def make(signs=None, trusts=(), url=None):
        monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(isolated / f"node{next(count)}"))
        monkeypatch.setenv("KDB_REMOTE_CACHE", url or server.url)
        monkeypatch.setenv("KDB_REMOTE_TIMEOUT_MS", "5000")  # a loaded CI machine: slow is not down
        key = keys[signs][0] if isinstance(signs, str) else signs
        monkeypatch.setenv("KDB_REMOTE_SIGNING_KEY", str(key or ""))
        pubs = [keys[t][1] if isinstance(t, str) else t for t in trusts]
        monkeypatch.setenv("KDB_REMOTE_TRUSTED_KEYS", os.pathsep.join(map(str, pubs)))
        return make_handle()
    return make


def _resolve(handle, sample=RELU):
    return handle.program(sample.kernel_file, sample.options)


def _refused(program) -> bool:
    return any(s.name == "remote" and s.outcome == "refused" for s in program.steps)


def _entry(server) -> tuple[bytes, bytes]:
    (name,) = server.client().keys(PREFIX + "*")
    return name, server.client().get(name)


def _warnings(capfd, about: str) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if about in line]


def test_a_signed_entry_is_a_hit_for_a_reader_that_trusts_its_key(node, server, keys, capfd):
    assert _resolve(node(signs="builder")).source == "jit"
    _, data = _entry(server)
    assert data.startswith(SIGNED_MAGIC) and data[SIGNATURE_AT - 16:SIGNATURE_AT] == keys["builder"][2].key_id.encode()
    program = _resolve(node(trusts=["stranger", "builder"]))
    assert program.source == "remote" and not _refused(program)
    assert _resolve(node()).source == "remote"  # a reader that asks for no signature loads it too
    err = capfd.readouterr().err
    assert "refusing it" not in err and "KDB_REMOTE" not in err


def test_a_reader_that_trusts_keys_refuses_an_unsigned_entry_and_compiles(node, server, capfd):
    _resolve(node())  # a writer without a signing key publishes a version-1 envelope
    assert _entry(server)[1].startswith(ENVELOPE_MAGIC)
    program = _resolve(node(trusts=["builder"]))
    assert program.source == "jit" and _refused(program)
    (warning,) = _warnings(capfd, "refusing it")
    assert "it is not signed" in warning


def test_a_reader_that_trusts_keys_and_signs_with_none_publishes_nothing(node, server):
    reader = node(trusts=["builder"])
    assert [t.writable for t in reader.sources if t.name == "remote"] == [False]
    assert _resolve(reader).source == "jit"
    assert server.client().keys(PREFIX + "*") == []  # other readers like it would refuse it anyway
    _resolve(node(signs="builder", trusts=["builder"]))  # a builder that also reads publishes, signed
    assert _entry(server)[1].startswith(SIGNED_MAGIC)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _new_binary_same_header(data: bytes) -> bytes:
    """The binary changed after signing, header (hash, signature) kept."""
    return _flip(data, len(data) - 1)


def _new_binary_rehashed(data: bytes) -> bytes:
    """The binary changed and the hash made to match it: only the signature can catch this."""
    import hashlib

    digest, binary = data[8:72], _flip(data, len(data) - 1)[BINARY_AT:]
    return data[:72] + hashlib.sha256(digest + binary).digest() + data[104:BINARY_AT] + binary


@pytest.mark.parametrize("tamper, said", [
    (lambda data: _flip(data, SIGNATURE_AT + 5), "its signature does not verify"),
    (_new_binary_same_header, "its hash does not match its bytes"),
    (_new_binary_rehashed, "its signature does not verify"),
], ids=["signature-flipped", "binary-changed", "binary-changed-and-rehashed"])
def test_a_tampered_signed_entry_is_refused_and_compiled_over(node, server, capfd, tamper, said):
    _resolve(node(signs="builder"))
    name, data = _entry(server)
    server.client().set(name, tamper(data))
    program = _resolve(node(trusts=["builder"]))
    assert program.source == "jit" and _refused(program)
    assert any(said in line for line in _warnings(capfd, "refusing it"))
    assert "Traceback" not in capfd.readouterr().err


def test_an_entry_signed_by_a_key_not_trusted_is_refused(node, server, keys, capfd):
    _resolve(node(signs="stranger"))
    program = _resolve(node(trusts=["builder"]))
    assert program.source == "jit" and _refused(program)
    (warning,) = _warnings(capfd, "refusing it")
    assert f"its signer is not trusted (key {keys['stranger'][2].key_id})" in warning


def test_a_signing_key_others_can_read_is_one_warning_and_nothing_is_published(node, server, keys, tmp_path,
                                                                                capfd):
    _resolve(node(signs="builder"))  # an entry to read
    loose = tmp_path / "loose.key"
    loose.write_bytes(keys["builder"][0].read_bytes())
    os.chmod(loose, 0o644)
    first, second = node(signs=loose), node(signs=loose)
    assert [t.writable for t in first.sources if t.name == "remote"] == [False]
    assert _resolve(first).source == "remote"  # still reads
    assert _resolve(second, SAMPLES[1]).source == "jit"
    assert len(server.client().keys(PREFIX + "*")) == 1  # its compile was not published
    (warning,) = _warnings(capfd, "KDB_REMOTE_SIGNING_KEY")
    assert f"chmod 600 {loose}" in warning and "nothing is published" in warning
    tier = next(t for t in first.sources if t.name == "remote")
    tier.store(DIGEST, b"binary")  # a publisher outside the chain publishes nothing either
    assert len(server.client().keys(PREFIX + "*")) == 1


@pytest.mark.parametrize("bad", ["missing", "private-key-given", "not-a-key"])
def test_trusted_keys_that_cannot_be_read_are_one_warning_and_the_tier_serves_nothing(node, server, keys, tmp_path,
                                                                                       capfd, bad):
    _resolve(node(signs="builder"))  # an entry every reader trusting the builder would load
    path = {"missing": tmp_path / "absent.pub", "private-key-given": keys["builder"][0],
            "not-a-key": tmp_path / "junk.pub"}[bad]
    if bad == "not-a-key":
        path.write_text("junk\n")
    programs = [_resolve(node(trusts=["builder", path])) for _ in range(2)]
    assert all(p.source == "jit" and _refused(p) for p in programs)  # fail closed: even the builder's entry
    (warning,) = _warnings(capfd, "KDB_REMOTE_TRUSTED_KEYS cannot be used")
    assert str(path) in warning and "serves nothing" in warning
    assert _entry(server)[1].startswith(SIGNED_MAGIC)  # their compiles did not replace the builder's entry


def test_doctor_says_which_key_signs_and_which_keys_are_trusted(isolated, server, keys, monkeypatch, fresh_log):
    monkeypatch.setenv("KDB_REMOTE_SIGNING_KEY", str(keys["builder"][0]))
    monkeypatch.setenv("KDB_REMOTE_TRUSTED_KEYS", os.pathsep.join(str(keys[k][1]) for k in ("builder", "stranger")))
    tier = RedisTier(server.url, entry_signing.from_env())
    try:
        checks = {c.item: c for c in tier.checks()}
    finally:
        tier.close()
    builder, stranger = keys["builder"][2].key_id, keys["stranger"][2].key_id
    assert checks["signs"].ok and f"yes, key {builder}" in checks["signs"].value
    assert checks["trusts"].ok and f"{builder}, {stranger}" in checks["trusts"].value
    monkeypatch.setenv("KDB_REMOTE_TRUSTED_KEYS", str(isolated / "absent.pub"))
    monkeypatch.setenv("KDB_REMOTE_SIGNING_KEY", "")
    checks = {c.item: c for c in entry_signing.from_env().checks()}
    assert checks["signs"].ok and checks["signs"].value.startswith("no")
    assert not checks["trusts"].ok and "every entry refused" in checks["trusts"].value


@pytest.mark.parametrize("given", [True, False], ids=["signing-given", "signing-from-the-environment"])
def test_store_signs_where_the_tier_has_a_signer(isolated, server, keys, monkeypatch, given):
    """What a publisher outside the chain calls, on a tier it made itself."""
    monkeypatch.setenv("KDB_REMOTE_SIGNING_KEY", str(keys["builder"][0]))
    tier = RedisTier(server.url, entry_signing.EntrySigning(signing.load_signer(keys["builder"][0])) if given else None)
    try:
        tier.store(DIGEST, b"binary")
        data = tier.load(DIGEST)
    finally:
        tier.close()
    trusted = [signing.load_public_key(keys["builder"][1])]
    assert unseal(data, DIGEST, trusted) == (b"binary", "")


def test_envelopes_of_both_versions_and_the_trust_they_need():
    signer, stranger = signing.generate(), signing.generate()
    plain, signed = seal(DIGEST, b"binary"), seal(DIGEST, b"binary", signer)
    assert plain.startswith(ENVELOPE_MAGIC) and len(plain) == 8 + 64 + 32 + 6  # the version-1 layout, unchanged
    assert signed.startswith(SIGNED_MAGIC) and len(signed) == BINARY_AT + 6
    for data in (plain, signed):
        assert unseal(data, DIGEST) == (b"binary", "")  # no trusted keys: both load after the hash check
        assert unseal(data, "cd" * 32)[0] is None  # bound to its key, signed or not
    assert unseal(signed, DIGEST, [stranger.public_key, signer.public_key]) == (b"binary", "")
    assert unseal(plain, DIGEST, [signer.public_key])[1].startswith("it is not signed")
    assert unseal(signed, DIGEST, [])[1].startswith("its signer is not trusted")  # fail closed
    assert unseal(signed, DIGEST, [stranger.public_key])[1].startswith("its signer is not trusted")
    assert unseal(signed[:BINARY_AT - 1], DIGEST, [signer.public_key])[1] == "it is not a sealed entry"
    # a signature moved onto another key's envelope does not verify there
    other = seal("cd" * 32, b"binary", signer)
    moved = other[:SIGNATURE_AT] + signed[SIGNATURE_AT:BINARY_AT] + other[BINARY_AT:]
    assert unseal(moved, "cd" * 32, [signer.public_key])[1].startswith("its signature does not verify")


def test_kdb_keys_new_makes_a_pair_and_never_replaces_it(tmp_path, capsys):
    from kdbkit.runtime.cli.app import main

    folder = tmp_path / "keys"
    assert main(["keys", "new", "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    key_path, pub_path = folder / "kdb-signing.key", folder / "kdb-signing.pub"
    assert os.stat(key_path).st_mode & 0o777 == 0o600
    key_id = signing.load_public_key(pub_path).key_id
    assert signing.load_signer(key_path).key_id == key_id and f"key id       {key_id}" in out
    assert f"export KDB_REMOTE_SIGNING_KEY={key_path.resolve()}" in out
    assert f"export KDB_REMOTE_TRUSTED_KEYS={pub_path.resolve()}" in out
    before = key_path.read_bytes()
    assert main(["keys", "new", "-o", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "exists already" in err and len(err.strip().splitlines()) == 1
    assert key_path.read_bytes() == before
