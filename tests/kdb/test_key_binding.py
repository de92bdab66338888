"""Never a wrong binary: damage to a bundle's or a user cache's index, rows or header gives a
miss (or a kdbkit error), never another key's bytes.

Files are made by the real writers (``write_bundle``; ``UserCache.put``) with keys that differ
by one character, re-laid out with 512-byte pages so that a sweep of every bit of the header
page and of the index's pages stays small, then damaged one bit at a time and read the way the
runtime reads them: a system bundle through ``Bundle.open(..., immutable=True)``, a user cache
through ``UserCache``.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from kdbkit.kdb import KdbError, Target, open_bundle, verify_bundle, write_bundle
from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.errors import CorruptEntryError
from kdbkit.runtime.program_key import ProgramKey
from kdbkit.runtime.user_cache import UserCache

TARGET = Target("cuda", "sm_90")
PAGE = 512


def _binary(i: int) -> bytes:
    """Small binaries, some compressible and some not, each unlike the others."""
    rng = random.Random(i)
    return (b"\x7fELF" + bytes([i]) * 40 + rng.randbytes(60)) if i % 2 else rng.randbytes(90)


# Keys one character apart: a flipped bit in a key turns one into another.
ENTRIES = {("add.cl", f"-DKDB_ADD={i} -mcpu=sm_90"): _binary(i) for i in range(1, 6)}
ENTRIES["adc.cl", "-DKDB_ADD=4 -mcpu=sm_90"] = _binary(9)


def _relayout(path: Path, wal: bool) -> Path:
    """The same file with 512-byte pages (the content as the writer wrote it)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = delete")
    conn.execute(f"PRAGMA page_size = {PAGE}")
    conn.execute("VACUUM")
    if wal:
        conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    return path


def _bundle(folder: Path, dictionary: bool | bytes = False) -> Path:
    path = write_bundle(folder / "sm_90.kdb", TARGET, [(n, a, b) for (n, a), b in ENTRIES.items()],
                        compiler="nvrtc 13.0", binary_format="cubin", dictionary=dictionary)
    return _relayout(path, wal=False)


def _user_cache_file(folder: Path) -> Path:
    cache = UserCache(folder, TARGET, compiler="nvrtc 13.0", binary_format="cubin")
    for (name, args), data in ENTRIES.items():
        assert cache.put(ProgramKey(name, args, ""), data)
    cache.close()
    return _relayout(cache.path, wal=True)


def _pages(path: Path, *names: str) -> list[int]:
    """The 1-based page numbers holding the b-trees called ``names`` (SQLite's dbstat)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        marks = ",".join("?" * len(names))
        return sorted({p for (p,) in conn.execute(f"SELECT pageno FROM dbstat WHERE name IN ({marks})", names)})


def _bits_of(pages: list[int]) -> list[int]:
    return [(p - 1) * PAGE * 8 + b for p in pages for b in range(PAGE * 8)]


def _flipped(original: bytes, bit: int) -> bytes:
    data = bytearray(original)
    data[bit // 8] ^= 1 << (bit % 8)
    return bytes(data)


class Outcome:
    """What the reads of all the damaged copies gave."""

    def __init__(self) -> None:
        self.trials = self.hits = self.misses = 0
        self.wrong: list[str] = []
        self.foreign: list[str] = []

    def check(self, where: str, key: tuple[str, str], got: bytes | None) -> None:
        if got is None:
            self.misses += 1
        elif got == ENTRIES[key]:
            self.hits += 1
        else:
            self.wrong.append(f"{where}: {key} gave another binary")

    def assert_clean(self) -> None:
        assert not self.wrong, f"{len(self.wrong)} wrong binaries in {self.trials} trials: {self.wrong[:5]}"
        assert not self.foreign, f"{len(self.foreign)} non-kdbkit errors in {self.trials} trials: {self.foreign[:5]}"


def _read_as_system_bundle(path: Path, where: str, outcome: Outcome) -> None:
    try:
        bundle = Bundle.open(path, immutable=True)
    except KdbError:
        outcome.misses += len(ENTRIES)
        return
    with bundle:
        bundle.warm_up()
        for key in ENTRIES:
            try:
                got = bundle.get(*key)
            except KdbError:
                got = None
            outcome.check(where, key, got)


def _read_as_user_cache(path: Path, where: str, outcome: Outcome) -> None:
    cache = UserCache(path.parent, TARGET, compiler="nvrtc 13.0", binary_format="cubin")
    try:
        for name, args in ENTRIES:
            outcome.check(where, (name, args), cache.get(ProgramKey(name, args, "")))
    finally:
        cache.close()


def _sweep(original_path: Path, bits: list[int], read, work: Path) -> Outcome:
    original = original_path.read_bytes()
    outcome = Outcome()
    work.mkdir()
    damaged = work / original_path.name
    for bit in bits:
        for leftover in work.iterdir():
            leftover.unlink() if leftover.is_file() else shutil.rmtree(leftover)
        damaged.write_bytes(_flipped(original, bit))
        outcome.trials += 1
        try:
            read(damaged, f"bit {bit} (page {bit // (PAGE * 8) + 1})", outcome)
        except Exception as exc:  # noqa: BLE001 - what the test is looking for
            outcome.foreign.append(f"bit {bit}: {type(exc).__name__}: {exc}")
    return outcome


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level("ERROR")  # thousands of damaged files: each warns, as it should


def test_the_files_are_small_and_sound(tmp_path):
    path = _bundle(tmp_path)
    assert verify_bundle(path).ok and path.stat().st_size // PAGE <= 16
    assert _pages(path, "idx_kern_db")
    with open_bundle(path) as bundle:
        assert {(n, a): b for n, a, b in bundle.items()} == ENTRIES


def test_every_bit_of_a_bundles_header_and_index_pages_gives_no_wrong_binary(tmp_path):
    (tmp_path / "made").mkdir()
    path = _bundle(tmp_path / "made")
    outcome = _sweep(path, _bits_of([1, *_pages(path, "idx_kern_db", "sqlite_autoindex_kdb_meta_1")]),
                     _read_as_system_bundle, tmp_path / "work")
    outcome.assert_clean()
    assert outcome.hits > 0 and outcome.misses > 0


def test_every_bit_of_a_user_caches_header_and_index_pages_gives_no_wrong_binary(tmp_path):
    (tmp_path / "made").mkdir()
    path = _user_cache_file(tmp_path / "made")
    outcome = _sweep(path, _bits_of([1, *_pages(path, "idx_kern_db")]), _read_as_user_cache, tmp_path / "work")
    outcome.assert_clean()
    assert outcome.hits > 0 and outcome.misses > 0


@pytest.mark.slow  # the header and index sweeps above are the quick loop's
@pytest.mark.parametrize("dictionary", [False, bytes(range(256)) * 16], ids=["plain", "dictionary"])
def test_every_bit_of_a_whole_bundle_gives_no_wrong_binary(tmp_path, dictionary):
    (tmp_path / "made").mkdir()
    path = _bundle(tmp_path / "made", dictionary)
    outcome = _sweep(path, list(range(path.stat().st_size * 8)), _read_as_system_bundle, tmp_path / "work")
    outcome.assert_clean()


@pytest.mark.slow
def test_every_bit_of_a_whole_user_cache_gives_no_wrong_binary(tmp_path):
    (tmp_path / "made").mkdir()
    path = _user_cache_file(tmp_path / "made")
    outcome = _sweep(path, list(range(path.stat().st_size * 8)), _read_as_user_cache, tmp_path / "work")
    outcome.assert_clean()


def test_a_random_sample_of_a_user_caches_other_bits_gives_no_wrong_binary(tmp_path):
    (tmp_path / "made").mkdir()
    path = _user_cache_file(tmp_path / "made")
    swept = set(_bits_of([1, *_pages(path, "idx_kern_db")]))
    rest = [b for b in range(path.stat().st_size * 8) if b not in swept]
    outcome = _sweep(path, random.Random(27).sample(rest, min(2000, len(rest))), _read_as_user_cache,
                     tmp_path / "work")
    outcome.assert_clean()


# -- rows moved on purpose ---------------------------------------------------------------------

A = ("add.cl", "-DKDB_ADD=4 -mcpu=sm_90")
B = ("add.cl", "-DKDB_ADD=5 -mcpu=sm_90")


def swap_rows(path: Path, first: tuple[str, str] = A, second: tuple[str, str] = B) -> None:
    """Give ``first``'s row ``second``'s blob and hash and the other way round (SQL, as a tool or
    a bug could)."""
    with sqlite3.connect(path) as conn:
        a, b = (conn.execute("SELECT kernel_blob, kernel_hash, uncompressed_size FROM kern_db WHERE kernel_name = ? "
                             "AND kernel_args = ?", key).fetchone() for key in (first, second))
        for key, row in ((first, b), (second, a)):
            conn.execute("UPDATE kern_db SET kernel_blob = ?, kernel_hash = ?, uncompressed_size = ? "
                         "WHERE kernel_name = ? AND kernel_args = ?", (*row, *key))
    conn.close()


def _misdirect_index(path: Path) -> tuple[str, str]:
    """Make B's index entry name another key (``=9``), so that key's lookup lands on B's row;
    returns that key. Done on the bytes of the index page, as damage would."""
    page = _pages(path, "idx_kern_db")[0]
    data = bytearray(path.read_bytes())
    at = data.find(B[1].encode(), (page - 1) * PAGE, page * PAGE)
    assert at > 0
    data[at + len("-DKDB_ADD=")] = ord("9")
    path.write_bytes(bytes(data))
    return B[0], B[1].replace("=5", "=9")


def test_swapped_rows_are_refused_by_the_reader_and_by_verify(tmp_path):
    path = _bundle(tmp_path)
    swap_rows(path)
    with Bundle.open(path, immutable=True) as bundle:
        for key in (A, B):
            with pytest.raises(CorruptEntryError, match="does not match kernel_hash"):
                bundle.get(*key)
    report = verify_bundle(path)
    assert not report.ok
    assert sum(A[1] in p or B[1] in p for p in report.problems) == 2, report.problems


def test_a_misdirected_index_entry_is_refused_by_the_reader_and_by_verify(tmp_path):
    path = _bundle(tmp_path)
    wrong_key = _misdirect_index(path)
    with Bundle.open(path, immutable=True) as bundle:
        with pytest.raises(CorruptEntryError, match="damaged index"):
            bundle.get(*wrong_key)
        assert bundle.get(*A) == ENTRIES[A]
    report = verify_bundle(path)
    assert not report.ok and any(B[1] in p and "index" in p for p in report.problems), report.problems


def test_a_duplicated_key_is_named_by_verify(tmp_path):
    path = _bundle(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX idx_kern_db")
        conn.execute("INSERT INTO kern_db(kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
                     "SELECT kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db "
                     "WHERE kernel_name = ? AND kernel_args = ?", A)
    conn.close()
    report = verify_bundle(path)
    assert any("all hold the key" in p and A[1] in p for p in report.problems), report.problems


def test_a_swapped_user_cache_entry_is_a_miss_and_is_removed(tmp_path):
    path = _user_cache_file(tmp_path)
    swap_rows(path)
    cache = UserCache(tmp_path, TARGET, compiler="nvrtc 13.0", binary_format="cubin")
    assert cache.get(ProgramKey(*A, "")) is None and cache.get(ProgramKey(*B, "")) is None
    cache.close()
    with open_bundle(path) as bundle:
        assert bundle.get(*A) is None and bundle.get(*B) is None  # removed, so that they are rebuilt


def _as_format_1(path: Path) -> Path:
    """The bundle as kdbkit wrote it before keyed hashes: format 1, plain xxh3_128 of the data."""
    import xxhash

    with sqlite3.connect(path) as conn:
        for (name, args), data in ENTRIES.items():
            conn.execute("UPDATE kern_db SET kernel_hash = ? WHERE kernel_name = ? AND kernel_args = ?",
                         (xxhash.xxh3_128_hexdigest(data), name, args))
        conn.execute("UPDATE kdb_meta SET value = '1' WHERE key = 'format_version'")
    conn.close()
    return path


def test_a_format_1_file_is_read_with_the_row_check(tmp_path):
    path = _as_format_1(_bundle(tmp_path))
    with open_bundle(path) as bundle:
        assert not bundle.keyed and bundle.get(*A) == ENTRIES[A]
    assert verify_bundle(path).ok
    wrong_key = _misdirect_index(path)
    with open_bundle(path) as bundle, pytest.raises(CorruptEntryError, match="damaged index"):
        bundle.get(*wrong_key)


def test_a_format_1_file_is_upgraded_when_opened_for_writing(tmp_path):
    path = _as_format_1(_bundle(tmp_path))
    with Bundle.open(path, writable=True) as bundle:
        assert bundle.keyed and bundle.metadata.format_version == 2
    assert verify_bundle(path).ok
    with open_bundle(path) as bundle:
        assert {(n, a): b for n, a, b in bundle.items()} == ENTRIES
