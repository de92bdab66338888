import os

import pytest

from kdbkit.kdb.codec import Codec, CodecError, digest, train_dictionary

from .conftest import fake_binary


@pytest.mark.parametrize("name", ["zstd", "bzip2"])
def test_round_trip(name):
    c = Codec(name)
    data = fake_binary(1)
    enc = c.encode(data)
    assert enc.uncompressed_size == len(data) and len(enc.blob) < len(data)
    assert c.decode(enc.blob, enc.uncompressed_size) == data


def test_incompressible_blob_is_stored_raw():
    data = os.urandom(4096)
    enc = Codec("zstd").encode(data)
    assert enc.uncompressed_size == 0 and enc.blob == data
    assert Codec("zstd").decode(enc.blob, 0) == data


def test_garbage_frame_is_a_codec_error():
    with pytest.raises(CodecError, match="does not decode"):
        Codec("zstd").decode(b"definitely not zstd", 100)
    with pytest.raises(CodecError, match="does not decode"):
        Codec("bzip2").decode(b"BZh9 garbage", 100)


def test_wrong_size_is_a_codec_error():
    enc = Codec("zstd").encode(fake_binary(2))
    with pytest.raises(CodecError):
        Codec("zstd").decode(enc.blob, enc.uncompressed_size - 1)


def test_dictionary_needs_the_dictionary_to_decode():
    blobs = [fake_binary(i) for i in range(64)]
    d = train_dictionary(blobs, dict_size=8 * 1024)
    assert d is not None
    with_dict = Codec("zstd", dictionary=d)
    enc = with_dict.encode(blobs[0])
    assert with_dict.decode(enc.blob, enc.uncompressed_size) == blobs[0]
    with pytest.raises(CodecError):
        Codec("zstd").decode(enc.blob, enc.uncompressed_size)


def test_too_few_samples_give_no_dictionary():
    assert train_dictionary([b"abc"] * 3) is None


def test_digests():
    assert digest(b"abc") == "06b05ab6733a618578af5f94892f3950"  # XXH3-128, the default
    assert digest(b"abc", "sha256") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert digest(b"abc", "md5") == "900150983cd24fb0d6963f7d28e17f72"
    with pytest.raises(CodecError):
        digest(b"", "crc32")
    with pytest.raises(CodecError):
        Codec("lz4")


def test_one_codec_is_safe_across_threads():
    import threading

    c = Codec("zstd")
    blobs = [fake_binary(i) for i in range(16)]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                enc = c.encode(blobs[i])
                assert c.decode(enc.blob, enc.uncompressed_size) == blobs[i]
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# -- size caps: a small blob that claims or expands to gigabytes is a corrupt entry -----------

BOMB_BYTES = 300 << 20  # more than any kernel binary (MAX_BINARY_BYTES is 256 MiB)


def test_an_entry_claiming_more_than_any_binary_is_refused_before_decoding():
    small = Codec("zstd").encode(b"x" * 1000).blob
    for codec in ("zstd", "bzip2"):
        with pytest.raises(CodecError, match="not a size from 1 to"):
            Codec(codec).decode(small, 5 << 30)  # the row claims 5 GiB


def test_a_zstd_frame_claiming_more_than_its_row_is_refused_without_expanding():
    import zstandard

    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(BOMB_BYTES))  # ~10 kB, claims 300 MiB
    assert len(bomb) < 64 << 10
    with pytest.raises(CodecError, match=f"zstd frame claims {BOMB_BYTES} bytes, row says 1000"):
        Codec("zstd").decode(bomb, 1000)


def test_a_zstd_frame_without_a_size_stops_at_the_row_size():
    import zstandard

    unsized = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(bytes(64 << 20))
    with pytest.raises(CodecError, match="does not decode"):
        Codec("zstd").decode(unsized, 1000)


def test_a_bzip2_bomb_stops_at_the_row_size():
    import bz2

    bomb = bz2.compress(bytes(BOMB_BYTES))  # a few hundred bytes that expand to 300 MiB
    assert len(bomb) < 4096
    with pytest.raises(CodecError, match="decoded 1001 bytes, row says 1000|does not end"):
        Codec("bzip2").decode(bomb, 1000)


def test_a_bomb_in_a_bundle_is_a_corrupt_entry(tmp_path):
    import sqlite3

    import zstandard

    from kdbkit.kdb import CorruptEntryError, Target, open_bundle, verify_bundle, write_bundle

    path = write_bundle(tmp_path / "sm_90.kdb", Target.parse("sm_90"), [("k.c.o", "-DN=1", b"x" * 5000)],
                        compiler="nvrtc 13.0", binary_format="cubin", dictionary=False)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE kern_db SET kernel_blob = ?, uncompressed_size = 5000",
                 (zstandard.ZstdCompressor().compress(bytes(BOMB_BYTES)),))
    conn.commit()
    conn.close()
    with open_bundle(path) as b, pytest.raises(CorruptEntryError, match="k.c.o .*is corrupt: zstd frame claims"):
        b.get("k.c.o", "-DN=1")
    assert not verify_bundle(path).ok
