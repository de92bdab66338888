"""Fuzzing the readers: damaged or random bytes give kdbkit errors, never another
exception type (UnicodeDecodeError, sqlite3.OperationalError, TypeError, KeyError, ZstdError
all escaped once).

The bundles and the find-db are small real files made by the real writers; each example
mutates a few bytes (or truncates, or is random bytes) and runs every read the runtime and the
CLI do. Bounded (examples and sizes) to run in seconds on a CI machine.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdbkit.kdb import KdbError, Target, verify_bundle, write_bundle
from kdbkit.kdb import codec as _codec
from kdbkit.kdb.bundle import Bundle
from kdbkit.kdb.find_db import FindDb, FindRecord, configs_in, read_rankings, write_system_find_db

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TARGET = Target("cuda", "sm_90")


def _binary(i: int) -> bytes:
    rng = random.Random(i)
    return b"\x7fELF" + bytes([i % 7]) * 30 + b"".join(rng.choice([b"mov", b"add", b"ld.global"]) for _ in range(60))


ENTRIES = [("add.cl", f"-DKDB_ADD={i}", _binary(i)) for i in range(24)]


def _trained_dictionary() -> bytes:
    """A real trained zstd dictionary (with its header, so damage can make it fail to load)."""
    dictionary = _codec.train_dictionary([b for _, _, b in ENTRIES] * 4, dict_size=1024, level=3)
    return dictionary or bytes(range(256)) * 4


def _bundle_bytes(dictionary: bool) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = write_bundle(Path(folder) / "sm_90.kdb", TARGET, ENTRIES, compiler="nvrtc 13.0", binary_format="cubin",
                            dictionary=_trained_dictionary() if dictionary else False, level=3)
        with Bundle.open(path, writable=True) as bundle:
            bundle.compact(page_size=1024)  # small pages: mutations land in every kind of page
        return path.read_bytes()


PLAIN, WITH_DICTIONARY = _bundle_bytes(False), _bundle_bytes(True)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One folder for every example's file (examples run one after another)."""
    return tmp_path_factory.mktemp("fuzz")


def _mutated(original: bytes, edits: list[tuple[int, int]], keep: int | None) -> bytes:
    data = bytearray(original)
    for at, value in edits:
        data[at % len(data)] = value
    return bytes(data[:keep] if keep else data)


EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)
TRUNCATION = st.one_of(st.none(), st.integers(1, 1 << 16))


def _read_every_way(work: Path, data: bytes) -> None:
    """Every read of a bundle the runtime and the CLI make; only kdbkit errors may come out."""
    path = work / "sm_90.kdb"
    for leftover in work.glob("sm_90.kdb*"):
        leftover.unlink()
    path.write_bytes(data)
    for immutable in (True, False):
        try:
            with Bundle.open(path, immutable=immutable) as bundle:
                _ = (bundle.metadata.target, bundle.metadata.source_digests, bundle.keyed)
                bundle.warm_up()
                for name, args, _ in ENTRIES[:6]:
                    try:
                        bundle.get(name, args)
                    except KdbError:
                        pass
                for read in (lambda: list(bundle.entries()), lambda: list(bundle.items()), bundle.count,
                             bundle.stats, bundle.integrity_check, lambda: list(bundle.checked_rows()),
                             bundle.duplicate_keys):
                    try:
                        read()
                    except KdbError:
                        pass
        except KdbError:
            pass
    verify_bundle(path)  # never raises: a report of problems


@pytest.mark.parametrize("original", [PLAIN, WITH_DICTIONARY], ids=["plain", "dictionary"])
def test_mutated_bundles_give_only_kdbkit_errors(original, work):
    @FUZZ
    @given(edits=EDITS, keep=TRUNCATION)
    def check(edits, keep):
        _read_every_way(work, _mutated(original, edits, keep))

    check()


@FUZZ
@given(data=st.binary(min_size=0, max_size=4096))
def test_random_bytes_give_only_kdbkit_errors(work, data):
    _read_every_way(work, data)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_damaged_dictionary_is_a_kdbkit_error(work, edits):
    """The dictionary alone damaged: a load error or a wrong decode, both kdbkit errors."""
    import sqlite3

    path = work / "dict.kdb"
    path.write_bytes(WITH_DICTIONARY)
    with sqlite3.connect(path) as conn:
        (dictionary,) = conn.execute("SELECT value FROM kdb_meta WHERE key = 'zstd_dict'").fetchone()
        conn.execute("UPDATE kdb_meta SET value = ? WHERE key = 'zstd_dict'", (_mutated(dictionary, edits, None),))
    conn.close()
    _read_every_way(work, path.read_bytes())


def _user_cache_bytes() -> bytes:
    from kdbkit.runtime.program_key import ProgramKey
    from kdbkit.runtime.user_cache import UserCache

    with tempfile.TemporaryDirectory() as folder:
        cache = UserCache(Path(folder), TARGET, compiler="nvrtc 13.0", binary_format="cubin")
        for name, args, data in ENTRIES:
            assert cache.put(ProgramKey(name, args, ""), data)
        cache.close()
        with Bundle.open(cache.path, writable=True) as bundle:  # out of WAL: one file holds it all
            bundle.compact(page_size=1024)
        return cache.path.read_bytes()


USER_CACHE = _user_cache_bytes()


@FUZZ
@given(edits=EDITS, keep=TRUNCATION)
def test_mutated_user_caches_give_only_kdbkit_errors_or_misses(work, edits, keep):
    """The user cache never raises: a damaged file is moved aside or left, an entry is a miss."""
    from kdbkit.runtime.program_key import ProgramKey
    from kdbkit.runtime.user_cache import UserCache

    folder = work / "ukdb"
    if folder.exists():
        for leftover in folder.iterdir():
            leftover.unlink() if leftover.is_file() else None
    folder.mkdir(exist_ok=True)
    cache = UserCache(folder, TARGET, compiler="nvrtc 13.0", binary_format="cubin")
    cache.path.write_bytes(_mutated(USER_CACHE, edits, keep))
    try:
        for name, args, data in ENTRIES[:6]:
            assert cache.get(ProgramKey(name, args, "")) in (None, data)
    finally:
        cache.close()


# -- the find-db -----------------------------------------------------------------------------------

def _find_db_bytes() -> bytes:
    records = [FindRecord(i, f"Solver{i}", rank, 0.5 * rank, 1024 * i) for rank, i in enumerate((3, 1, 2))]
    with tempfile.TemporaryDirectory() as folder:
        path = write_system_find_db(Path(folder) / "sm_90_132.fdb", "sm_90_132",
                                    {f"softmax,shape={n}": records for n in range(1, 30)}, producer="kdbkit test")
        return path.read_bytes()


FIND_DB = _find_db_bytes()


def _read_find_db(work: Path, data: bytes) -> None:
    folder = work / "fdb"
    folder.mkdir(exist_ok=True)
    path = folder / "sm_90_132.fdb"
    path.write_bytes(data)
    for read in (lambda: configs_in(path), lambda: read_rankings(path)):
        try:
            read()
        except KdbError:
            pass
    warnings = []
    db = FindDb("sm_90_132", [folder], None, producer="kdbkit test", warn=lambda key, message: warnings.append(message))
    try:
        for n in (1, 7, 29):
            db.load(f"softmax,shape={n}")  # a damaged system find-db is skipped with a warning, never raised
    finally:
        db.close()


@FUZZ
@given(edits=EDITS, keep=TRUNCATION)
def test_mutated_find_dbs_give_only_kdbkit_errors(work, edits, keep):
    _read_find_db(work, _mutated(FIND_DB, edits, keep))


@FUZZ
@given(data=st.binary(min_size=0, max_size=4096))
def test_random_find_dbs_give_only_kdbkit_errors(work, data):
    _read_find_db(work, data)
