"""Entries encoded away from the writer (an offline build's workers) and copied as stored."""

from __future__ import annotations

import sqlite3

import pytest

from kdbkit.kdb import BundleError, CorruptEntryError, Target, open_bundle, write_bundle
from kdbkit.kdb.codec import encode_for_bundle
from kdbkit.kdb.writer import write_stored_bundle

TARGET = Target("cuda", "sm_90")
DATA = {("a.c", f"-DN={i}"): bytes(range(256)) * (i + 2) + b"tail" * i for i in range(6)}


def test_pre_encoded_entries_read_back_and_copy_as_stored(tmp_path):
    path = write_stored_bundle(tmp_path / "sm_90.kdb", TARGET, [(n, a, encode_for_bundle(n, a, b)) for (n, a), b in DATA.items()],
                               compiler="nvrtc 13.0", binary_format="cubin", sources={"a.c": "1" * 64})
    with open_bundle(path) as bundle:
        assert {(n, a): b for n, a, b in bundle.items()} == DATA
        assert bundle.metadata.source_digests == {"a.c": "1" * 64} and bundle.metadata.dictionary_size == 0
        stored = list(bundle.stored_items())
    assert [s.blob for _, _, s in stored] == [encode_for_bundle(n, a, DATA[n, a]).blob for n, a, _ in stored]
    again = write_stored_bundle(tmp_path / "again.kdb", TARGET, stored, compiler="nvrtc 13.0", binary_format="cubin")
    assert {(n, a): b for n, a, b in open_bundle(again).items()} == DATA


def test_a_dictionary_bundle_gives_re_encoded_entries_and_refuses_pre_encoded_ones(tmp_path):
    path = write_bundle(tmp_path / "d.kdb", TARGET, [(n, a, b) for (n, a), b in DATA.items()], compiler="nvrtc 13.0",
                        binary_format="cubin", dictionary=bytes(range(256)) * 8)
    with open_bundle(path) as bundle:
        stored = list(bundle.stored_items())
    assert all(s == encode_for_bundle(n, a, DATA[n, a]) for n, a, s in stored)
    with open_bundle(path, writable=True) as bundle, pytest.raises(BundleError, match="no dictionary"):
        bundle.put_stored(stored)


def test_a_damaged_entry_is_not_copied(tmp_path):
    path = write_stored_bundle(tmp_path / "sm_90.kdb", TARGET, [(n, a, encode_for_bundle(n, a, b)) for (n, a), b in DATA.items()],
                               compiler="nvrtc 13.0", binary_format="cubin")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE kern_db SET kernel_hash = ? WHERE kernel_args = '-DN=3'", ("0" * 32,))
    with open_bundle(path) as bundle, pytest.raises(CorruptEntryError):
        list(bundle.stored_items())


def test_an_entry_encoded_for_another_key_is_refused(tmp_path):
    """A pre-encoded entry's keyed hash binds it to its key: storing it under another is refused."""
    stored = encode_for_bundle("a.c", "-DN=4", DATA["a.c", "-DN=4"])
    with pytest.raises(BundleError, match="encoded for a.c"):
        write_stored_bundle(tmp_path / "sm_90.kdb", TARGET, [("a.c", "-DN=5", stored)], compiler="nvrtc 13.0",
                            binary_format="cubin")
