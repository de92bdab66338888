"""Micro-benchmark of kdb bundles on real cubins: build, open, lookup, compression.

What it does (details and caveats go into the generated ``docs/bench_kdb.md``):

1. Compiles (or loads from cache) a corpus of a few hundred distinct real sm_90 cubins with
   NVRTC (``scripts/cubin_corpus.py``).
2. Builds bundles of 1k, 10k and 100k entries with ``kdb.write_bundle`` (zstd 19, trained
   dictionary when it pays), timing each build; entry ``i`` is corpus cubin ``i % N`` with a
   16-byte per-entry id appended after the ELF's last header table, under a MIOpen-style key.
3. In fresh child processes (page cache warm): ``open_bundle`` time (30 runs), the first
   ``get()`` of each child, then ``get()`` latency for 2000 random existing keys, misses,
   and a breakdown of a lookup into SQLite fetch, zstd decode and hash check.
4. Compression on the distinct corpus: raw, zstd-19, zstd-19 + 32 kB dictionary (counted in),
   bzip2 -9 with MIOpen's raw fallback, each through kdb's own writer/codec where it applies.

Writes ``docs/bench_kdb.json``, ``docs/bench_kdb.png`` and ``docs/bench_kdb.md``.

    python scripts/bench_kdb.py            # full run, about 6-7 minutes on 2 cores (corpus compile included)
    python scripts/bench_kdb.py --quick    # 1k and 10k entries, fewer runs; writes under the work dir
    python scripts/bench_kdb.py --quick --corpus-scale 0.03 --sizes 300 --open-runs 3 --lookups 100 \
        --work-dir /tmp/bk --corpus-dir /tmp/bk/corpus   # a check of the script, a minute on 2 cores
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import datetime as dt
import hashlib
import json
import multiprocessing as mp
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

TARGET = "sm_90_132"
COMPILER = "nvrtc"  # completed with the version at run time
OPEN_TARGET_MS = 5.0
LOOKUP_TARGET_US = 100.0
SIZE_TARGET = 0.7
DEFAULT_WORK = Path(os.environ.get("KDB_BENCH_WORK", "/tmp/kdbkit-bench-work"))

# Shapes in the per-entry option string: a real bundle holds each kernel specialised for many
# problem shapes, which is what makes 100k entries out of a few hundred sources.
_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_HW = (7, 8, 14, 16, 17, 28, 32, 35, 56, 64, 73, 112, 128, 149, 224, 299)
_CH = (3, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024)


# ----------------------------------------------------------------------------------------
# Entries
# ----------------------------------------------------------------------------------------


def entry_key(i: int, corpus) -> tuple[str, str]:
    """kern_db key of entry ``i``: the corpus program's -D options plus a unique problem shape."""
    e = corpus.entries[i % len(corpus.entries)]
    r = i // len(corpus.entries)
    n = _BATCH[r % len(_BATCH)]
    r //= len(_BATCH)
    hw = _HW[r % len(_HW)]
    r //= len(_HW)
    c = _CH[r % len(_CH)]
    r //= len(_CH)
    k = _CH[r % len(_CH)]
    r //= len(_CH)
    assert r == 0, "more entries than shapes: extend _BATCH/_HW/_CH"
    args = (f"{e.options} -DMLO_BATCH_SZ={n} -DMLO_N_INPUTS={c} -DMLO_N_OUTPUTS={k} -DMLO_IN_HEIGHT={hw} "
            f"-DMLO_IN_WIDTH={hw} -DMLO_IN_STRIDE={hw} -DMLO_IN_CHANNEL_STRIDE={hw * hw} "
            f"-DMLO_IN_BATCH_STRIDE={hw * hw * c} -mcpu=sm_90")
    return e.kernel_name, args


def entry_blob(i: int, corpus) -> bytes:
    """Corpus cubin ``i % N`` with a 16-byte id appended after its last ELF header table.

    NVRTC cubins end with the program header table; bytes after it belong to no section or
    segment, so the ELF stays valid. The id is a hash (incompressible), not a counter.
    """
    return corpus.entries[i % len(corpus.entries)].cubin + hashlib.blake2b(
        i.to_bytes(8, "little"), digest_size=16).digest()


def entries_for(n: int, corpus) -> list[tuple[str, str, bytes]]:
    return [(*entry_key(i, corpus), entry_blob(i, corpus)) for i in range(n)]


# ----------------------------------------------------------------------------------------
# Build phase (runs in pool workers)
# ----------------------------------------------------------------------------------------


# --corpus-scale reaches the pool's spawned workers through their environment, so that they load
# the same (smaller) corpus the parent compiled.
CORPUS_SCALE_ENV = "BENCH_KDB_CORPUS_SCALE"


def _corpus_scale() -> float:
    return float(os.environ.get(CORPUS_SCALE_ENV, "1"))


def _load_corpus(corpus_dir: Path):
    import cubin_corpus
    return cubin_corpus.build_corpus(corpus_dir, scale=_corpus_scale(), log=lambda m: None)


def _nvrtc_compiler() -> str:
    import cubin_corpus
    return f"{COMPILER} {cubin_corpus.nvrtc_version()}"


def kdb_sources_digest() -> str:
    """Hash of kdb/*.py as they are now: the code that built and read the bundles."""
    import kdbkit.kdb
    h = hashlib.sha256()
    for f in sorted(Path(kdbkit.kdb.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def task_build(n: int, path: Path, corpus_dir: Path, level: int | None, reuse: bool) -> dict:
    """Build one n-entry bundle with write_bundle(dictionary=True); time it."""
    from kdbkit.kdb import Target, open_bundle, write_bundle
    corpus = _load_corpus(corpus_dir)
    side = path.with_suffix(".build.json")
    ident = {"entries": n, "corpus": corpus.info["size_bytes"]["total"], "count": len(corpus.entries),
             "level": level, "kdb_sources": kdb_sources_digest()}
    if reuse and path.is_file() and side.is_file():
        rec = json.loads(side.read_text())
        if rec.get("ident") == ident:
            rec["reused"] = True
            return rec
    entries = entries_for(n, corpus)
    raw = sum(len(b) for _, _, b in entries)
    kwargs = {} if level is None else {"level": level}
    t0 = time.perf_counter()
    write_bundle(path, Target.parse(TARGET), entries, compiler=_nvrtc_compiler(), binary_format="cubin",
                 dictionary=True, **kwargs)
    build_s = time.perf_counter() - t0
    del entries
    with open_bundle(path) as b:
        st = b.stats()
        ok = b.integrity_check() == []
    rec = {
        "ident": ident, "entries": n, "build_s": round(build_s, 2), "raw_bytes": raw,
        "raw_mb_per_s": round(raw / build_s / 1e6, 2), "file_bytes": st.file_bytes, "stored_bytes": st.stored_bytes,
        "dictionary_bytes": st.dictionary_bytes, "ratio_raw_over_stored": round(st.ratio, 3),
        "file_bytes_per_entry": round(st.file_bytes / n), "integrity_ok": ok, "reused": False,
        "level": level if level is not None else "kdb default (zstd.BUNDLE_LEVEL)",
    }
    side.write_text(json.dumps(rec, indent=1))
    return rec


def _ro(path: Path, immutable: bool = False) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else ""),
                           uri=True)


def bundle_dictionary(path: Path) -> bytes | None:
    """The bundle's zstd dictionary, read from kdb_meta with plain SQLite."""
    with contextlib.closing(_ro(path)) as conn:
        row = conn.execute("SELECT value FROM kdb_meta WHERE key = 'zstd_dict'").fetchone()
    return row[0] if row else None


def bundle_rows(path: Path) -> list[tuple[bytes, int]]:
    with contextlib.closing(_ro(path)) as conn:
        return conn.execute("SELECT kernel_blob, uncompressed_size FROM kern_db").fetchall()


def task_compression(work: Path, corpus_dir: Path) -> dict:
    """Stored size of the distinct corpus under each codec; kdb's writer for the zstd/bzip2 bundles."""
    from kdbkit.kdb import Target, codec as kcodec, open_bundle, write_bundle
    corpus = _load_corpus(corpus_dir)
    entries = [(e.kernel_name, e.options + " -mcpu=sm_90", e.cubin) for e in corpus.entries]
    blobs = [e.cubin for e in corpus.entries]
    raw = sum(map(len, blobs))
    out: dict = {"corpus_cubins": len(blobs), "raw_bytes": raw}
    target = Target.parse(TARGET)
    compiler = _nvrtc_compiler()

    def bundle(name: str, **kw) -> dict:
        path = work / f"corpus-{name}.kdb"
        t0 = time.perf_counter()
        write_bundle(path, target, entries, compiler=compiler, binary_format="cubin", **kw)
        wall = time.perf_counter() - t0
        with open_bundle(path) as b:
            st = b.stats()
        rows = bundle_rows(path)
        return {"stored_bytes": st.stored_bytes, "dictionary_bytes": st.dictionary_bytes,
                "stored_plus_dict": st.stored_bytes + st.dictionary_bytes, "file_bytes": st.file_bytes,
                "raw_stored_entries": sum(1 for _, size in rows if size == 0),
                "ratio": round(raw / (st.stored_bytes + st.dictionary_bytes), 3), "write_s": round(wall, 2)}

    out["zstd19"] = bundle("zstd19", dictionary=False)
    out["zstd19_dict"] = bundle("zstd19-dict", dictionary=True)
    out["zstd19_dict"]["dictionary_kept"] = out["zstd19_dict"]["dictionary_bytes"] > 0
    out["kdb_bzip2_bundle"] = bundle("bzip2", codec="bzip2", dictionary=False)
    # What MIOpen itself would ship: the same rows, SQLite's default 4 kB pages, no kdb_meta.
    import shutil
    miopen = work / "corpus-miopen-like.kdb"
    shutil.copyfile(work / "corpus-bzip2.kdb", miopen)
    with contextlib.closing(sqlite3.connect(miopen, isolation_level=None)) as conn:
        conn.execute("DROP TABLE kdb_meta")
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("VACUUM")
    out["miopen_like_file_bytes"] = miopen.stat().st_size

    # bzip2 -9 per blob with MIOpen's rule: store raw when bzip2 does not shrink it.
    stored = [p if len(p) < len(b) else b for p, b in ((bz2.compress(b, 9), b) for b in blobs)]
    bz = sum(map(len, stored))
    out["bzip2_9"] = {"stored_bytes": bz, "raw_stored_entries": sum(1 for p, b in zip(stored, blobs) if p is b),
                      "ratio": round(raw / bz, 3)}
    out["zstd19_over_bzip2"] = round(out["zstd19"]["stored_bytes"] / bz, 3)
    out["zstd19_dict_over_bzip2"] = round(out["zstd19_dict"]["stored_plus_dict"] / bz, 3)

    # Held-out check of the dictionary: train on even-indexed cubins, compress the odd ones.
    train, test = blobs[0::2], blobs[1::2]
    d = kcodec.train_dictionary(train, dict_size=32 * 1024, level=kcodec.BUNDLE_LEVEL)
    plain = kcodec.Codec("zstd", level=kcodec.BUNDLE_LEVEL)
    test_plain = sum(len(plain.encode(b).blob) for b in test)
    test_bz = sum(min(len(bz2.compress(b, 9)), len(b)) for b in test)
    ho = {"train_cubins": len(train), "test_cubins": len(test), "test_raw_bytes": sum(map(len, test)),
          "test_zstd19_bytes": test_plain, "test_bzip2_bytes": test_bz}
    if d:
        trained = kcodec.Codec("zstd", level=kcodec.BUNDLE_LEVEL, dictionary=d)
        test_dict = sum(len(trained.encode(b).blob) for b in test)
        ho.update({"test_zstd19_dict_bytes": test_dict, "dictionary_bytes": len(d),
                   "dict_blobs_over_bzip2": round(test_dict / test_bz, 3),
                   "dict_blobs_plus_dict_over_bzip2": round((test_dict + len(d)) / test_bz, 3)})
    out["held_out_dictionary"] = ho

    # Per family, bzip2 vs zstd19+dict (blob bytes; dictionary shared, not apportioned).
    with open_bundle(work / "corpus-zstd19-dict.kdb") as b:
        sizes = {(i.kernel_name, i.kernel_args): i.stored_size for i in b.entries()}
    fam: dict[str, dict] = {}
    for (name, args, blob), bzb in zip(entries, stored):
        f = fam.setdefault(name, {"count": 0, "raw": 0, "bzip2": 0, "zstd19_dict_blobs": 0})
        f["count"] += 1
        f["raw"] += len(blob)
        f["bzip2"] += len(bzb)
        f["zstd19_dict_blobs"] += sizes[(name, args)]
    out["by_family"] = fam
    return out


def task_dict_cost(n: int, corpus_dir: Path) -> dict:
    """What write_bundle's dictionary step costs for an n-entry bundle: the same sample it would take."""
    from kdbkit.kdb import codec as kcodec
    from kdbkit.kdb.writer import DICT_SIZE, MAX_TRAINING_SAMPLES, choose_dictionary
    corpus = _load_corpus(corpus_dir)
    blobs = [entry_blob(i, corpus) for i in range(n)]
    step = max(1, n // MAX_TRAINING_SAMPLES)
    sample = blobs[::step]
    t0 = time.perf_counter()
    kcodec.train_dictionary(sample, dict_size=DICT_SIZE, level=kcodec.BUNDLE_LEVEL)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    kept = choose_dictionary(blobs) is not None
    choose_s = time.perf_counter() - t0
    return {"entries": n, "samples": len(sample), "sample_bytes": sum(map(len, sample)),
            "train_dictionary_s": round(train_s, 2), "choose_dictionary_s": round(choose_s, 2), "kept": kept}


def codec_timings(work: Path, corpus, comp: dict) -> None:
    """Codec speeds on the distinct corpus, measured in the parent once the pool is done (nothing else
    running), best of 3 (decode) or 1 (encode) passes, one core. Adds them to ``comp``."""
    import zstandard as zstd
    from kdbkit.kdb import codec as kcodec
    blobs = [e.cubin for e in corpus.entries]
    raw = sum(map(len, blobs))

    def best_us(fn, passes: int = 3) -> float:
        best = float("inf")
        for _ in range(passes):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return round(best / len(blobs) * 1e6, 2)

    for key, name in (("zstd19", "zstd19"), ("zstd19_dict", "zstd19-dict"), ("kdb_bzip2_bundle", "bzip2")):
        path = work / f"corpus-{name}.kdb"
        codec = kcodec.Codec("bzip2" if name == "bzip2" else "zstd", dictionary=bundle_dictionary(path))
        rows = bundle_rows(path)
        comp[key]["decode_us_per_blob"] = best_us(lambda: [codec.decode(b, n) for b, n in rows])
    packed = [bz2.compress(b, 9) for b in blobs]
    comp["bzip2_9"]["decode_us_per_blob"] = best_us(lambda: [bz2.decompress(p) for p in packed])
    comp["bzip2_9"]["encode_mb_per_s"] = round(raw / (best_us(lambda: [bz2.compress(b, 9) for b in blobs], 1)
                                                      * len(blobs)), 2)
    dictionary = bundle_dictionary(work / "corpus-zstd19-dict.kdb")
    for key, d in (("zstd19_encode_mb_per_s", None), ("zstd19_dict_encode_mb_per_s", dictionary)):
        c = kcodec.Codec("zstd", level=kcodec.BUNDLE_LEVEL, dictionary=d)
        comp[key] = round(raw / (best_us(lambda: [c.encode(b) for b in blobs], 1) * len(blobs)), 2)

    # What verifying a read costs: XXH3-128 of the decoded bytes (what get() does), SHA-256 (what
    # it did first) and zstd's own frame checksum (XXH64, checked while decoding).
    zdict = zstd.ZstdCompressionDict(dictionary) if dictionary else None
    frames = {ck: [zstd.ZstdCompressor(level=kcodec.BUNDLE_LEVEL, dict_data=zdict, write_content_size=True,
                                       write_checksum=ck).compress(b) for b in blobs] for ck in (False, True)}
    dctx = zstd.ZstdDecompressor(dict_data=zdict)
    comp["verify_cost"] = {
        "decode_us_per_blob": best_us(lambda: [dctx.decompress(f, max_output_size=len(b))
                                               for f, b in zip(frames[False], blobs)], 5),
        "decode_with_frame_checksum_us_per_blob": best_us(lambda: [dctx.decompress(f, max_output_size=len(b))
                                                                   for f, b in zip(frames[True], blobs)], 5),
        "sha256_us_per_blob": best_us(lambda: [hashlib.sha256(b).hexdigest() for b in blobs], 5),
        "xxh3_128_us_per_blob": best_us(lambda: [kcodec.digest(b, "xxh3_128") for b in blobs], 5),
        "frame_checksum_extra_bytes": sum(map(len, frames[True])) - sum(map(len, frames[False])),
        "note": "best of 5 passes over the distinct corpus, one core",
    }


def _run_task(task: tuple) -> tuple[str, dict, float]:
    kind, *args = task
    t0 = time.perf_counter()
    if kind == "dictcost":
        return "dictcost", task_dict_cost(*args), time.perf_counter() - t0
    if kind == "build":
        res = task_build(*args)
        return f"build-{args[0]}", res, time.perf_counter() - t0
    res = task_compression(*args)
    return "compression", res, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------
# Measurement children (fresh processes)
# ----------------------------------------------------------------------------------------


def _open(path: str, mode: str):
    """open_bundle as the brief's API has it (``default``), or as the runtime opens installed
    system bundles (``immutable``: read-only, SQLite skips locking and change checks)."""
    from kdbkit.kdb import open_bundle
    if mode == "immutable":
        return open_bundle(path, immutable=True)
    return open_bundle(path)


def supports_immutable() -> bool:
    import inspect
    from kdbkit.kdb import open_bundle
    return "immutable" in inspect.signature(open_bundle).parameters


def child_open(bundle: str, keys_file: str, pick: int, mode: str) -> None:
    """Time open_bundle (through its metadata read) and the first get() in this fresh process."""
    import kdbkit.kdb  # noqa: F401 - imports are not part of the timing
    keys = json.loads(Path(keys_file).read_text())["hits"]
    name, args, size = keys[pick % len(keys)]
    t0 = time.perf_counter_ns()
    b = _open(bundle, mode)
    _ = b.metadata.target  # the first metadata read happened inside open_bundle; this is a field access
    t1 = time.perf_counter_ns()
    data = b.get(name, args)
    t2 = time.perf_counter_ns()
    if data is None or len(data) != size:
        raise SystemExit(f"wrong data for {name} {args}")
    b.close()
    print(json.dumps({"open_ns": t1 - t0, "first_get_ns": t2 - t1, "size": size}))


def child_lookup(bundle: str, keys_file: str, warmup: int, mode: str) -> None:
    """get() latency for the key list, misses, then the lookup's parts timed one by one."""
    from kdbkit.kdb import codec as kcodec
    from kdbkit.kdb import open_bundle
    keys = json.loads(Path(keys_file).read_text())
    hits, misses = keys["hits"], keys["misses"]
    b = _open(bundle, mode)
    hash_alg = b.metadata.hash
    for name, args, size in keys["warmup"][:warmup]:
        b.get(name, args)
    lat = []
    for name, args, size in hits:
        t0 = time.perf_counter_ns()
        data = b.get(name, args)
        t1 = time.perf_counter_ns()
        if data is None or len(data) != size:
            raise SystemExit(f"wrong data for {name} {args}")
        lat.append(t1 - t0)
    miss = []
    for name, args in misses:
        t0 = time.perf_counter_ns()
        data = b.get(name, args)
        miss.append(time.perf_counter_ns() - t0)
        if data is not None:
            raise SystemExit("a miss key was found")
    b.close()

    # Parts, each over the same keys: SQLite row fetch, zstd decode, the hash check of the result.
    codec = kcodec.Codec("zstd", dictionary=bundle_dictionary(Path(bundle)))
    conn = _ro(Path(bundle), immutable=mode == "immutable")
    q = "SELECT kernel_blob, kernel_hash, uncompressed_size FROM kern_db WHERE kernel_name = ? AND kernel_args = ?"
    for name, args, _ in keys["warmup"][:warmup]:
        blob, _, usize = conn.execute(q, (name, args)).fetchone()
        codec.decode(blob, usize)
    sql, dec, sha, stored = [], [], [], []
    rows = []
    for name, args, _ in hits:
        t0 = time.perf_counter_ns()
        r = conn.execute(q, (name, args)).fetchone()
        sql.append(time.perf_counter_ns() - t0)
        rows.append(r)
    datas = []
    for blob, _, usize in rows:
        t0 = time.perf_counter_ns()
        d = codec.decode(blob, usize)
        dec.append(time.perf_counter_ns() - t0)
        datas.append(d)
        stored.append(len(blob))
    for (name, args, _), (blob, h, _), d in zip(hits, rows, datas):
        t0 = time.perf_counter_ns()
        ok = kcodec.keyed_digest(name, args, d, hash_alg) == h  # format 2: the hash covers the key
        sha.append(time.perf_counter_ns() - t0)
        if not ok:
            raise SystemExit("hash mismatch")
    conn.close()

    # Noise floor: the smallest hit looked up again and again (same pages, same bytes every time).
    b = _open(bundle, mode)
    name, args, _ = min(hits, key=lambda k: k[2])
    same = []
    for _ in range(len(hits)):
        t0 = time.perf_counter_ns()
        b.get(name, args)
        same.append(time.perf_counter_ns() - t0)
    b.close()
    print(json.dumps({"get_ns": lat, "miss_ns": miss, "sql_ns": sql, "decode_ns": dec, "hash_ns": sha,
                      "hash": hash_alg,
                      "sizes": [s for _, _, s in hits], "stored": stored, "same_key_ns": same,
                      "same_key_size": min(k[2] for k in hits)}))


def file_layout(path: Path) -> dict:
    """Where a bundle's bytes go, from SQLite's dbstat: pages, unused bytes and payload per object."""
    with contextlib.closing(_ro(path)) as conn:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        try:
            rows = conn.execute("SELECT name, count(*), sum(pgsize), sum(unused), sum(payload) FROM dbstat "
                                "GROUP BY name").fetchall()
        except sqlite3.OperationalError:
            rows = []  # SQLite built without dbstat
        blob, keys = conn.execute("SELECT sum(length(kernel_blob)), sum(length(kernel_name) + length(kernel_args) "
                                  "+ length(kernel_hash)) FROM kern_db").fetchone()
    objs = {name: {"pages": n, "bytes": size, "unused": unused, "payload": payload}
            for name, n, size, unused, payload in rows}
    return {"page_size": page, "file_bytes": path.stat().st_size, "blob_bytes": blob, "key_and_hash_bytes": keys,
            "unused_bytes": sum(o["unused"] for o in objs.values()),
            "index_bytes": objs.get("idx_kern_db", {}).get("bytes", 0), "objects": objs}


def page_size_study(path: Path, keys_file: Path, warmup: int, page_sizes=(4096, 16384, 65536)) -> list[dict]:
    """Copies of a bundle rewritten with other SQLite page sizes (VACUUM): file size and lookups.

    Readers need nothing: the page size lives in the file header. The first row is the bundle
    as write_bundle made it.
    """
    import shutil
    base = {k: v for k, v in file_layout(path).items() if k != "objects"}
    out = [dict(base, as_written=True)]
    for ps in page_sizes:
        if ps == base["page_size"]:
            continue
        dst = path.with_name(f"{path.stem}.page{ps}.kdb")
        shutil.copyfile(path, dst)
        with contextlib.closing(sqlite3.connect(dst, isolation_level=None)) as conn:
            conn.execute(f"PRAGMA page_size = {ps}")
            conn.execute("VACUUM")
        warm_page_cache(dst)
        lk = _child(["--child-lookup", str(dst), str(keys_file), str(warmup), "default"])
        rec = {k: v for k, v in file_layout(dst).items() if k != "objects"}
        rec.update({"lookup_us": summary(lk["get_ns"], "us"), "sql_us": summary(lk["sql_ns"], "us")})
        out.append(rec)
        dst.unlink()
    return out


def _child(args: list[str], py: str = sys.executable) -> dict:
    cmd = [py, str(Path(__file__).resolve())] + args
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
    if res.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------
# Statistics, machine, outputs
# ----------------------------------------------------------------------------------------


def pct(xs, q: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    import numpy as np
    return float(np.percentile(np.asarray(xs, dtype=float), q))


def summary(xs_ns: list[int], unit: str) -> dict:
    div = {"us": 1e3, "ms": 1e6}[unit]
    xs = [x / div for x in xs_ns]
    return {"unit": unit, "n": len(xs), "median": round(pct(xs, 50), 3), "p90": round(pct(xs, 90), 3),
            "p99": round(pct(xs, 99), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "mean": round(statistics.fmean(xs), 3)}


def machine_info() -> dict:
    import zstandard
    cpu = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k in ("model name", "cpu family", "model", "stepping", "cpu MHz", "cache size") and k not in cpu:
                cpu[k] = v
    except OSError:
        pass
    mem = ""
    try:
        mem = next(ln.split(":")[1].strip() for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu_model": cpu.get("model name", platform.processor()), "cpu_family": cpu.get("cpu family"),
        "cpu_model_number": cpu.get("model"), "cpu_mhz": cpu.get("cpu MHz"), "cpus": os.cpu_count(),
        "memory": mem, "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "zstd": zstandard.ZSTD_VERSION if isinstance(zstandard.ZSTD_VERSION, str)
        else ".".join(map(str, zstandard.ZSTD_VERSION)),
        "python_zstandard": zstandard.__version__,
    }
    try:
        import ctypes
        import ctypes.util
        lib = ctypes.util.find_library("bz2")
        if lib:
            f = ctypes.CDLL(lib).BZ2_bzlibVersion
            f.restype = ctypes.c_char_p
            info["bzip2"] = f().decode().split(",")[0]
    except (OSError, AttributeError):
        pass
    try:
        info["nvrtc"] = _nvrtc_compiler().split()[1]
    except Exception:  # noqa: BLE001 - informational only
        pass
    try:
        info["kdbkit_commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                               capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "kdb"],
                               capture_output=True, text=True).stdout.strip()
        info["kdb_uncommitted_changes"] = bool(dirty)
    except OSError:
        pass
    info["kdb_sources_sha256"] = kdb_sources_digest()
    return info


def _load_and_steal() -> tuple[str, int]:
    """1/5/15-minute load average, and the CPU ticks the hypervisor stole so far."""
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        steal = int(Path("/proc/stat").read_text().splitlines()[0].split()[8])
    except (OSError, IndexError, ValueError):
        return "", 0
    return load, steal


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 22):
            pass


def make_plot(res: dict, lookups_100k: dict | None, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bundles = res["bundles"]
    ns = [b["entries"] for b in bundles]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    ax = axes[0][0]
    ax.plot(ns, [b["open_ms"]["median"] for b in bundles], "o-", label="open_bundle, median")
    ax.plot(ns, [b["open_ms"]["p99"] for b in bundles], "s--", label="open_bundle, p99")
    ax.plot(ns, [b["first_get_us"]["median"] / 1e3 for b in bundles], "^-", label="first get() in process, median")
    ax.plot(ns, [b["first_get_us"]["p99"] / 1e3 for b in bundles], "v--", label="first get() in process, p99")
    ax.axhline(OPEN_TARGET_MS, color="red", lw=1, ls=":", label=f"open target {OPEN_TARGET_MS:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.05, OPEN_TARGET_MS * 4)
    ax.set_xlabel("entries in bundle")
    ax.set_ylabel("ms")
    ax.set_title(f"Open in a fresh process ({res['config']['open_runs']} runs, page cache warm)")
    ax.legend(fontsize=8)
    ax.grid(alpha=.3, which="both")

    ax = axes[0][1]
    for key, style, label in (("median", "o-", "get() median"), ("p99", "s--", "get() p99")):
        ax.plot(ns, [b["lookup_us"][key] for b in bundles], style, label=label)
    ax.plot(ns, [b["miss_us"]["median"] for b in bundles], "x-", label="miss median")
    ax.plot(ns, [b["parts_us"]["hash"]["median"] for b in bundles], ":", marker=".", label="hash check part, median")
    ax.plot(ns, [b["parts_us"]["decode"]["median"] for b in bundles], ":", marker="+", label="zstd decode part, median")
    ax.plot(ns, [b["parts_us"]["sql"]["median"] for b in bundles], ":", marker="d", label="SQLite fetch part, median")
    ax.plot(ns, [b["parts_us"]["sql_plus_decode"]["p99"] for b in bundles], "--", marker="v",
            label="fetch + decode (no hash), p99")
    ax.axhline(LOOKUP_TARGET_US, color="red", lw=1, ls=":", label=f"p99 target {LOOKUP_TARGET_US:g} µs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(b["lookup_us"]["p99"] for b in bundles)
    ax.set_ylim(1, top * 12)
    ax.set_xlabel("entries in bundle")
    ax.set_ylabel("µs per lookup")
    ax.set_title(f"get() = fetch + decompress + verify ({res['config']['lookups']} random keys)")
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    ax.grid(alpha=.3, which="both")

    ax = axes[1][0]
    c = res["compression"]
    labels = ["raw", "bzip2 -9\n(MIOpen)", "zstd 19", "zstd 19\n+ dict"]
    vals = [c["raw_bytes"], c["bzip2_9"]["stored_bytes"], c["zstd19"]["stored_bytes"], c["zstd19_dict"]["stored_bytes"]]
    colors = ["#999999", "#c0504d", "#4f81bd", "#4f81bd"]
    bars = ax.bar(labels, [v / 1e6 for v in vals], color=colors)
    ax.bar(labels[3], c["zstd19_dict"]["dictionary_bytes"] / 1e6, bottom=vals[3] / 1e6, color="#9bbb59",
           label="dictionary (32 kB)")
    for bar, v in zip(bars, vals):
        extra = c["zstd19_dict"]["dictionary_bytes"] if bar is bars[3] else 0
        ax.text(bar.get_x() + bar.get_width() / 2, (v + extra) / 1e6, f"{(v + extra) / 1e6:.2f} MB\n"
                f"{(v + extra) / c['bzip2_9']['stored_bytes']:.2f}x bz2", ha="center", va="bottom", fontsize=8)
    ax.axhline(SIZE_TARGET * c["bzip2_9"]["stored_bytes"] / 1e6, color="red", lw=1, ls=":",
               label=f"target {SIZE_TARGET:g} x bzip2")
    ax.set_ylabel("MB stored")
    ax.set_title(f"Stored size of {c['corpus_cubins']} distinct cubins by codec")
    ax.set_ylim(0, c["raw_bytes"] / 1e6 * 1.18)
    ax.legend(fontsize=8)

    ax = axes[1][1]
    if lookups_100k:
        sizes = np.asarray(lookups_100k["sizes"]) / 1e3
        ax.scatter(sizes, np.asarray(lookups_100k["get_ns"]) / 1e3, s=5, alpha=.4, label="get()")
        ax.scatter(sizes, np.asarray(lookups_100k["hash_ns"]) / 1e3, s=3, alpha=.3, label="hash check part")
        ax.scatter(sizes, np.asarray(lookups_100k["decode_ns"]) / 1e3, s=3, alpha=.3, label="zstd decode part")
        ax.axhline(LOOKUP_TARGET_US, color="red", lw=1, ls=":", label=f"{LOOKUP_TARGET_US:g} µs")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("cubin size (kB, uncompressed)")
        ax.set_ylabel("µs")
        ax.set_title(f"Lookup latency vs cubin size, {lookups_100k['entries']:,} entries")
        ax.legend(fontsize=8)
        ax.grid(alpha=.3, which="both")
    fig.suptitle(f"kdb bundles on real sm_90 cubins — {res['machine']['cpu_model']}, {res['machine']['cpus']} CPUs, "
                 f"Python {res['machine']['python']}, SQLite {res['machine']['sqlite']}, zstd {res['machine']['zstd']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mb(x: float) -> str:
    return f"{x / 1e6:,.2f}"


def make_md(res: dict, path: Path, png_name: str) -> None:
    m, cfg, cor, c = res["machine"], res["config"], res["corpus"], res["compression"]
    sz = cor["size_bytes"]
    L = []
    a = L.append
    a("# kdb bundle micro-benchmark (real cubins)")
    a("")
    a(f"Generated by `scripts/bench_kdb.py` on {res['date']}. Raw numbers: `{Path(res['json_name']).name}`; "
      f"plot: `{png_name}`.")
    a("")
    a("## Command")
    a("")
    a("```")
    a(res["command"])
    a("```")
    a("")
    a(f"Total wall time {res['wall_s']:.0f} s (corpus compile {cor['compile_wall_s']:.0f} s of it; "
      f"{cor['compiled_this_run']} cubins compiled this run, the rest from the cache in `{cor['cache_dir']}`).")
    a("")
    a("## Machine")
    a("")
    a(f"- CPU: {m['cpu_model']} (family {m['cpu_family']}, model {m['cpu_model_number']}, {m['cpu_mhz']} MHz), "
      f"{m['cpus']} CPUs, {m['memory']} RAM; {m['os']}")
    a(f"- Load average at start {m.get('loadavg_at_start')}, at end {m.get('loadavg_at_end')}; "
      f"CPU ticks stolen by the hypervisor during the run: {m.get('steal_ticks_during_run')}")
    a(f"- Python {m['python']}, SQLite {m['sqlite']}, zstd {m['zstd']} (python-zstandard {m['python_zstandard']}), "
      f"bzip2 {m.get('bzip2', '?')}, NVRTC {m.get('nvrtc', '?')}, kdbkit at {m.get('kdbkit_commit', '?')}"
      f"{' with uncommitted changes in kdb/' if m.get('kdb_uncommitted_changes') else ''} "
      f"(kdb/*.py sha256 {m.get('kdb_sources_sha256')})")
    a("")
    a("## What was measured")
    a("")
    a(f"**Corpus.** {cor['distinct_cubins']} distinct real `{cor['arch']}` cubins compiled with {cor['compiler']} "
      f"from generated CUDA C kernels of the kinds a DNN library ships ({cor['specs']} specs, "
      f"{cor['duplicate_cubins_dropped']} byte-identical results dropped): one-kernel tensor ops (fill/copy/scale/"
      "cast/bias), elementwise activations forward and backward in f32/f64/f16/bf16/int8, shared-memory reductions "
      "(tree and warp-shuffle), tiled GEMMs (block tiles 32-128, micro-tiles 2x2-8x8, K unroll 1-8, transposes, "
      "epilogues), direct 2D convolutions (filters 1x1-11x11, strides 1/2/4, output tiles, input-channel tiles), "
      "and row softmax / log-softmax; each specialised with MIOpen-style `-D` options (`scripts/cubin_corpus.py`).")
    a(f"Sizes: min {sz['min']:,} B, p10 {sz['p10']:,}, median {sz['median']:,}, mean {sz['mean']:,}, "
      f"p90 {sz['p90']:,}, max {sz['max']:,} B; {_mb(sz['total'])} MB in all.")
    a("")
    a("| program | cubins | min B | median B | max B |")
    a("|---|---:|---:|---:|---:|")
    for k, v in cor["by_family"].items():
        a(f"| `{k}` | {v['count']} | {v['min']:,} | {v['median']:,} | {v['max']:,} |")
    a("")
    a(f"**Bundles.** Entry *i* is corpus cubin *i* mod {cor['distinct_cubins']} with a 16-byte id (BLAKE2b of *i*, "
      "so incompressible) appended after the ELF's program header table, which is the last thing in an NVRTC cubin; "
      "the bytes belong to no section, so the ELF stays valid. Its key is the program name (e.g. `conv2d_direct.cu.o`) "
      "and the cubin's own `-D` options plus a unique problem shape and `-mcpu=sm_90` "
      f"(e.g. `{res['example_key'][1][:150]}...`, {res['example_key_len']} characters), as a "
      "real bundle holds each kernel specialised for many shapes. Bundles are written once with "
      "`write_bundle(..., dictionary=True)` at kdb's default level (zstd 19); the build time covers dictionary "
      "training, compression, inserts and VACUUM. The 1k/10k bundles and the compression study run in a second "
      "process while the 100k bundle builds (2 cores, no SMT).")
    a("")
    a("*Why the repetition does not flatter the numbers.* Every blob is compressed on its own, so a repeated cubin "
      "costs as many bytes as a new one and the file, its page count and B-tree depth are those of the same number "
      "of distinct binaries of the same sizes; SQLite does not deduplicate. A get() reads, decompresses and "
      "hashes exactly as many bytes as with distinct binaries. The one place repetition could help is the "
      "dictionary, trained on a sample of the bundle's blobs: with a few hundred sources it sees the same cubins "
      "it later compresses. That is why the size target is judged on the distinct corpus only (below), where the "
      "dictionary is likewise trained on the blobs it compresses (which is what `write_bundle` does for real), "
      "with a held-out check. The bundles' sizes are reported but not used for the target."
      + (" One effect works the other way: the writer samples every 50th entry of the 100k bundle for training, "
         f"and gcd(50, {cor['distinct_cubins']}) = {res['gcd_100k']}, so its dictionary saw only "
         f"{cor['distinct_cubins'] // res['gcd_100k']} of the {cor['distinct_cubins']} sources."
         if 100000 in cfg["sizes"] and res["gcd_100k"] > 1 else ""))
    a("")
    a(f"**Open.** {cfg['open_runs']} fresh processes per bundle and open mode (`python scripts/bench_kdb.py "
      "--child-open`); "
      "in each, `time.perf_counter_ns()` around `open_bundle(path)` only (connect, schema probe, `kdb_meta` read "
      "including the 32 kB dictionary), not interpreter start or imports; then the same process's first `get()` "
      "of a random key (statement preparation and the decompressor's dictionary load included). The file was "
      "read once beforehand, so the **OS page cache is warm**; these are not cold-disk numbers. "
      f"With {cfg['open_runs']} runs the p99 is close to the maximum.")
    a("")
    a(f"**Lookup.** {cfg['lookup_runs']} more fresh processes per bundle and open mode each open it, do "
      f"{cfg['warmup']} warm-up gets, then time `get()` on the same {cfg['lookups']} keys drawn uniformly from all "
      f"entries (each get returns the verified bytes; the length is checked), and {cfg['misses']} misses. Then, "
      "on the same keys, the parts of a lookup one by one: the SQLite `SELECT` of the row through the unique "
      "index, the zstd decode (kdb's Codec with the bundle's dictionary) and the hash of the result that "
      "`get()` compares with `kernel_hash`. Last, the smallest of those cubins is fetched again and again "
      "(noise floor).")
    a("")
    a("**Compression.** On the distinct corpus: raw; `write_bundle(dictionary=False)` and "
      "`write_bundle(dictionary=True)`"
      " (both zstd 19, numbers from `Bundle.stats()`; the dictionary's bytes are added); bzip2 -9 per blob with "
      "`bz2`, storing a blob raw when bzip2 does not shrink it, as MIOpen does; kdb's own bzip2 bundle as a "
      "cross-check.")
    a("")
    a("## Results")
    a("")
    a("### Bundles: build, size, open, lookup")
    a("")
    a(f"get() columns pool {cfg['lookup_runs']} fresh processes x {cfg['lookups']} random keys "
      f"({cfg['lookup_runs'] * cfg['lookups']:,} lookups); 'p99 per run' is each process's own p99.")
    a("")
    a("| entries | build s | build MB/s (raw) | file MB | stored MB | dict | file B/entry | open median ms | "
      "open p99 ms | "
      "first get median µs | first get p99 µs | get median µs | get p90 µs | get p99 µs | get p99 per run µs | "
      "get max µs | miss median µs |")
    a("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in res["bundles"]:
        a(f"| {b['entries']:,} | {b['build_s']:.1f} | {b['raw_mb_per_s']:.1f} | {_mb(b['file_bytes'])} | "
          f"{_mb(b['stored_bytes'])} | {b['dictionary_bytes'] // 1024} kB | {b['file_bytes_per_entry']:,} | "
          f"{b['open_ms']['median']:.3f} | {b['open_ms']['p99']:.3f} | {b['first_get_us']['median']:.0f} | "
          f"{b['first_get_us']['p99']:.0f} | {b['lookup_us']['median']:.1f} | {b['lookup_us']['p90']:.1f} | "
          f"{b['lookup_us']['p99']:.1f} | {', '.join(f'{x:.0f}' for x in b['lookup_p99_per_run_us'])} | "
          f"{b['lookup_us']['max']:.0f} | {b['miss_us']['median']:.1f} |")
    a("")
    if all("immutable" in b for b in res["bundles"]):
        a("Open modes: `open_bundle(path)` (the default, measured above and judged against the target) and "
          "`open_bundle(path, immutable=True)`, which is how `runtime/system_bundles.py` opens installed bundles "
          f"(SQLite skips file locks and change checks). Same number of runs and the same keys:")
        a("")
        a("| entries | open median / p99 ms (default) | open median / p99 ms (immutable) | first get median µs "
          "(default / immutable) | get median / p99 µs (default) | get median / p99 µs (immutable) | "
          "SQLite fetch median µs (default / immutable) |")
        a("|---:|---:|---:|---:|---:|---:|---:|")
        for b in res["bundles"]:
            im = b["immutable"]
            a(f"| {b['entries']:,} | {b['open_ms']['median']:.3f} / {b['open_ms']['p99']:.3f} | "
              f"{im['open_ms']['median']:.3f} / {im['open_ms']['p99']:.3f} | {b['first_get_us']['median']:.0f} / "
              f"{im['first_get_us']['median']:.0f} | {b['lookup_us']['median']:.1f} / {b['lookup_us']['p99']:.1f} | "
              f"{im['lookup_us']['median']:.1f} / {im['lookup_us']['p99']:.1f} | "
              f"{b['parts_us']['sql']['median']:.1f} / {im['sql_us']['median']:.1f} |")
        a("")
    a("Noise floor: the smallest looked-up cubin fetched again and again in the same process (µs):")
    a("")
    a("| entries | cubin B | median | p99 | p99.9 | max |")
    a("|---:|---:|---:|---:|---:|---:|")
    for b in res["bundles"]:
        q = b["same_key_us"]
        a(f"| {b['entries']:,} | {q['size']:,} | {q['median']:.1f} | {q['p99']:.1f} | {q['p999']:.1f} | "
          f"{q['max']:.0f} |")
    a("")
    a("Parts of a lookup (same keys, timed separately; µs):")
    a("")
    a("| entries | SQLite fetch median / p99 | zstd decode median / p99 | hash check median / p99 | "
      "fetch + decode, no hash (per key) median / p99 | get() median / p99 |")
    a("|---:|---:|---:|---:|---:|---:|")
    for b in res["bundles"]:
        p = b["parts_us"]
        a(f"| {b['entries']:,} | {p['sql']['median']:.1f} / {p['sql']['p99']:.1f} | "
          f"{p['decode']['median']:.1f} / {p['decode']['p99']:.1f} | {p['hash']['median']:.1f} / "
          f"{p['hash']['p99']:.1f} | {p['sql_plus_decode']['median']:.1f} / {p['sql_plus_decode']['p99']:.1f} | "
          f"{b['lookup_us']['median']:.1f} / {b['lookup_us']['p99']:.1f} |")
    big = res["bundles"][-1]
    if big.get("by_size_us"):
        a("")
        a(f"get() latency by cubin size at {big['entries']:,} entries (µs):")
        a("")
        a("| cubin size | lookups | median | p99 |")
        a("|---|---:|---:|---:|")
        for row in big["by_size_us"]:
            a(f"| {row['range']} | {row['n']} | {row['median']:.1f} | {row['p99']:.1f} |")
    a("")
    a("### Where the file's bytes go (SQLite `dbstat`)")
    a("")
    a("| entries | page size | file MB | blobs MB | keys + hash in rows MB | index MB | unused in pages MB | "
      "file / blobs |")
    a("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in res["bundles"]:
        lay = b["layout"]
        a(f"| {b['entries']:,} | {lay['page_size']} | {_mb(lay['file_bytes'])} | {_mb(lay['blob_bytes'])} | "
          f"{_mb(lay['key_and_hash_bytes'])} | {_mb(lay['index_bytes'])} | {_mb(lay['unused_bytes'])} | "
          f"{lay['file_bytes'] / lay['blob_bytes']:.2f} |")
    ps = res["page_size_study"]
    a("")
    a(f"Same {ps['entries']:,}-entry bundle rewritten with other SQLite page sizes (a copy, `PRAGMA page_size` + "
      "`VACUUM`; readers need no change, the page size is in the file header). Lookups: one fresh process, "
      f"{cfg['lookups']} keys; the row marked 'as written' is write_bundle's own file and pools "
      f"{cfg['lookup_runs']} processes:")
    a("")
    a("| page size | file MB | unused in pages MB | file / blobs | get median µs | get p99 µs |")
    a("|---:|---:|---:|---:|---:|---:|")
    for v in sorted(ps["variants"], key=lambda v: v["page_size"]):
        a(f"| {v['page_size']}{' (as written)' if v.get('as_written') else ''} | {_mb(v['file_bytes'])} | "
          f"{_mb(v['unused_bytes'])} | {v['file_bytes'] / v['blob_bytes']:.2f} | {v['lookup_us']['median']:.1f} | "
          f"{v['lookup_us']['p99']:.1f} |")
    a("")
    a("### Compression of the distinct corpus")
    a("")
    a("| codec | stored bytes | ratio raw/stored | stored / bzip2 | entries stored raw | decode µs/blob (mean) | "
      "SQLite file bytes | file / bzip2 file |")
    a("|---|---:|---:|---:|---:|---:|---:|---:|")
    bz = c["bzip2_9"]["stored_bytes"]
    kb = c["kdb_bzip2_bundle"]
    bzf = c["miopen_like_file_bytes"]
    a(f"| raw | {c['raw_bytes']:,} | 1.00 | {c['raw_bytes'] / bz:.2f} | {c['corpus_cubins']} | - | - | - |")
    a(f"| bzip2 -9 (MIOpen, `bz2`) | {bz:,} | {c['bzip2_9']['ratio']:.2f} | 1.00 | "
      f"{c['bzip2_9']['raw_stored_entries']} | {c['bzip2_9']['decode_us_per_blob']:.1f} | {bzf:,} (MIOpen-like: "
      f"4 kB pages, kern_db only) | 1.00 |")
    a(f"| bzip2 via kdb writer (cross-check) | {kb['stored_bytes']:,} | {kb['ratio']:.2f} | "
      f"{kb['stored_bytes'] / bz:.2f} | {kb['raw_stored_entries']} | {kb['decode_us_per_blob']:.1f} | "
      f"{kb['file_bytes']:,} | {kb['file_bytes'] / bzf:.2f} |")
    z = c["zstd19"]
    a(f"| zstd 19, no dictionary (kdb) | {z['stored_bytes']:,} | {z['ratio']:.2f} | {c['zstd19_over_bzip2']:.2f} | "
      f"{z['raw_stored_entries']} | {z['decode_us_per_blob']:.1f} | {z['file_bytes']:,} | "
      f"{z['file_bytes'] / bzf:.2f} |")
    zd = c["zstd19_dict"]
    a(f"| zstd 19 + {zd['dictionary_bytes'] // 1024} kB dictionary, dictionary included (kdb) | "
      f"{zd['stored_plus_dict']:,} | {zd['ratio']:.2f} | {c['zstd19_dict_over_bzip2']:.2f} | "
      f"{zd['raw_stored_entries']} | {zd['decode_us_per_blob']:.1f} | {zd['file_bytes']:,} | "
      f"{zd['file_bytes'] / bzf:.2f} |")
    a("")
    ho = c["held_out_dictionary"]
    if "dict_blobs_over_bzip2" in ho:
        a(f"Held-out check: a dictionary trained on the {ho['train_cubins']} even-indexed cubins compresses the other "
          f"{ho['test_cubins']} to {ho['dict_blobs_over_bzip2']:.2f}x their bzip2 size "
          f"({ho['dict_blobs_plus_dict_over_bzip2']:.2f}x with the dictionary counted in), against "
          f"{ho['test_zstd19_bytes'] / ho['test_bzip2_bytes']:.2f}x for zstd 19 alone.")
        a("")
    vc = c["verify_cost"]
    a(f"Verifying a read, per blob on this corpus ({vc['note']}): XXH3-128 of the decoded bytes "
      f"{vc['xxh3_128_us_per_blob']:.2f} µs (what get() does), SHA-256 {vc['sha256_us_per_blob']:.1f} µs; zstd decode {vc['decode_us_per_blob']:.1f} µs without and "
      f"{vc['decode_with_frame_checksum_us_per_blob']:.1f} µs with zstd's frame checksum "
      f"(+{vc['frame_checksum_extra_bytes'] // c['corpus_cubins']} bytes per blob).")
    a("")
    a(f"zstd 19 encode throughput on this corpus: {c['zstd19_encode_mb_per_s']:.1f} MB/s without dictionary, "
      f"{c['zstd19_dict_encode_mb_per_s']:.1f} MB/s with (one core); bzip2 -9: "
      f"{c['bzip2_9']['encode_mb_per_s']:.1f} MB/s.")
    a("")
    a("Per program (blob bytes; the shared dictionary is not apportioned):")
    a("")
    a("| program | cubins | raw | bzip2 | zstd 19 + dict | zstd+dict / bzip2 |")
    a("|---|---:|---:|---:|---:|---:|")
    for k, f in c["by_family"].items():
        a(f"| `{k}` | {f['count']} | {f['raw']:,} | {f['bzip2']:,} | {f['zstd19_dict_blobs']:,} | "
          f"{f['zstd19_dict_blobs'] / f['bzip2']:.2f} |")
    a("")
    a("### Targets")
    a("")
    a("| target | threshold | measured | result |")
    a("|---|---|---|---|")
    for t in res["targets"]:
        a(f"| {t['name']} | {t['threshold']} | {t['measured']} | **{'PASS' if t['pass'] else 'FAIL'}** |")
    a("")
    if res.get("observations"):
        a("## Observations")
        a("")
        for o in res["observations"]:
            a(f"- {o}")
        a("")
    a("## Caveats")
    a("")
    if res.get("kdb_changed_during_run"):
        a("- **kdb/*.py changed while this run was in progress**: the numbers may mix two versions of kdb.")
    a("- Timings are Python-level (`perf_counter_ns` around the call), on a shared 2-CPU VM; single runs, so "
      "expect a few percent run-to-run noise and occasional scheduler outliers in max/p99.")
    a("- Page cache warm throughout; a first open after boot or eviction adds disk reads (one page for the "
      "header and `sqlite_master`, a few for `kdb_meta`; a lookup touches index pages plus the row's overflow chain).")
    a("- The corpus is generated kernels, not a vendor library's; sizes and code style are realistic, but a "
      "real library's cubins may share more (or less) with each other, which moves the dictionary's gain.")
    a("")
    path.write_text("\n".join(L))


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def by_size_table(sizes: list[int], lat_ns: list[int]) -> list[dict]:
    edges = [0, 8_000, 16_000, 32_000, 64_000, 1 << 40]
    names = ["< 8 kB", "8-16 kB", "16-32 kB", "32-64 kB", ">= 64 kB"]
    rows = []
    for lo, hi, nm in zip(edges, edges[1:], names):
        xs = [t / 1e3 for s, t in zip(sizes, lat_ns) if lo <= s < hi]
        if xs:
            rows.append({"range": nm, "n": len(xs), "median": round(pct(xs, 50), 2), "p99": round(pct(xs, 99), 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kdb bundle micro-benchmark on real NVRTC cubins")
    ap.add_argument("--quick", action="store_true", help="1k and 10k entries, fewer runs; output under the work dir")
    ap.add_argument("--corpus-dir", type=Path, default=None, help="cubin cache (default /tmp/kdbkit-bench-corpus)")
    ap.add_argument("--work-dir", type=Path, default=DEFAULT_WORK, help="where bundles are written")
    ap.add_argument("--out-dir", type=Path, default=None, help="outputs (default docs/, or the work dir with --quick)")
    ap.add_argument("--sizes", default=None, help="comma-separated entry counts (default 1000,10000,100000)")
    ap.add_argument("--open-runs", type=int, default=None)
    ap.add_argument("--lookups", type=int, default=None)
    ap.add_argument("--lookup-runs", type=int, default=None, help="fresh processes doing the lookups (default 3)")
    ap.add_argument("--jobs", type=int, default=None, help="processes for compiling and building (default: CPUs)")
    ap.add_argument("--level", type=int, default=None, help="zstd level for the bundles (default: kdb's)")
    ap.add_argument("--corpus-scale", type=float, default=None, help="fraction of the corpus's few hundred "
                    "cubins to compile (e.g. 0.03: 14 cubins, for a check of the script; default 1)")
    ap.add_argument("--reuse", action="store_true", help="reuse bundles built by an earlier run with the same inputs")
    ap.add_argument("--child-open", nargs=4, metavar=("BUNDLE", "KEYS", "PICK", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--child-lookup", nargs=4, metavar=("BUNDLE", "KEYS", "WARMUP", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child_open:
        child_open(args.child_open[0], args.child_open[1], int(args.child_open[2]), args.child_open[3])
        return 0
    if args.child_lookup:
        child_lookup(args.child_lookup[0], args.child_lookup[1], int(args.child_lookup[2]), args.child_lookup[3])
        return 0

    import cubin_corpus
    if args.corpus_scale is not None:
        os.environ[CORPUS_SCALE_ENV] = str(args.corpus_scale)
    t_start = time.perf_counter()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([1000, 10000] if args.quick
                                                                        else [1000, 10000, 100000])
    open_runs = args.open_runs or (10 if args.quick else 30)
    lookups = args.lookups or (500 if args.quick else 2000)
    lookup_runs = args.lookup_runs or (1 if args.quick else 3)
    warmup, n_misses = 20, 200
    corpus_dir = args.corpus_dir or cubin_corpus.DEFAULT_DIR
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    out_dir = args.out_dir or (work / "quick" if args.quick else REPO / "docs")
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or os.cpu_count() or 1

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    load_start, steal_start = _load_and_steal()
    immutable_ok = supports_immutable()
    kdb_digest_start = kdb_sources_digest()
    corpus = cubin_corpus.build_corpus(corpus_dir, jobs=jobs, scale=_corpus_scale(), log=log)
    log(f"corpus: {len(corpus.entries)} distinct cubins, {corpus.info['size_bytes']['total'] / 1e6:.1f} MB "
        f"(median {corpus.info['size_bytes']['median']} B)")

    # -- build bundles and run the compression study, largest first, on `jobs` processes --
    tasks = [("build", n, work / f"bench-{n}.kdb", corpus_dir, args.level, args.reuse)
             for n in sorted(sizes, reverse=True)]
    tasks.insert(1, ("compression", work, corpus_dir))
    if not args.quick:
        tasks.append(("dictcost", 10000, corpus_dir))
    results: dict[str, dict] = {}
    ctx = mp.get_context("spawn")
    log(f"building {', '.join(str(n) for n in sorted(sizes))}-entry bundles and the compression study "
        f"on {jobs} processes ...")
    with ctx.Pool(min(jobs, len(tasks))) as pool:
        for name, res, wall in pool.imap_unordered(_run_task, tasks, chunksize=1):
            results[name] = res
            log(f"  {name} done in {wall:.1f} s" + (f" (build {res['build_s']} s, file {res['file_bytes'] / 1e6:.1f} MB"
                                                    f"{', reused' if res.get('reused') else ''})"
                                                    if name.startswith("build") else ""))

    # -- measure each bundle in fresh processes --
    bundles = []
    lookups_big = None
    rng = random.Random(12345)
    for n in sorted(sizes):
        path = work / f"bench-{n}.kdb"
        keys_file = work / f"bench-{n}.keys.json"
        pick = [rng.randrange(n) for _ in range(lookups)]
        warm = [rng.randrange(n) for _ in range(warmup)]
        hits = [[*entry_key(i, corpus), len(entry_blob(i, corpus))] for i in pick]
        misses = [[entry_key(i, corpus)[0], entry_key(i, corpus)[1] + f" -DMISS={j}"]
                  for j, i in enumerate(rng.randrange(n) for _ in range(n_misses))]
        keys_file.write_text(json.dumps({"hits": hits, "warmup": [[*entry_key(i, corpus), 0] for i in warm],
                                         "misses": misses}))
        warm_page_cache(path)
        log(f"{n} entries: {open_runs} fresh-process opens ...")
        _child(["--child-open", str(path), str(keys_file), "0", "default"])  # discarded: warms the interpreter
        opens = [_child(["--child-open", str(path), str(keys_file), str(k), "default"]) for k in range(open_runs)]
        imm_opens = imm_lk = None
        if immutable_ok:
            imm_opens = [_child(["--child-open", str(path), str(keys_file), str(k), "immutable"])
                         for k in range(open_runs)]
        log(f"{n} entries: {lookup_runs} x {lookups} lookups in fresh processes ...")
        runs = [_child(["--child-lookup", str(path), str(keys_file), str(warmup), "default"])
                for _ in range(lookup_runs)]
        if immutable_ok:
            imm_runs = [_child(["--child-lookup", str(path), str(keys_file), str(warmup), "immutable"])
                        for _ in range(lookup_runs)]
            imm_lk = {k: [x for r in imm_runs for x in r[k]] for k in ("get_ns", "sql_ns")}
        lk = {k: [x for r in runs for x in r[k]] for k in runs[0] if isinstance(runs[0][k], list)}
        rec = dict(results[f"build-{n}"])
        rec.pop("ident", None)
        rec.update({
            "open_ms": summary([o["open_ns"] for o in opens], "ms"),
            "first_get_us": summary([o["first_get_ns"] for o in opens], "us"),
            "lookup_us": summary(lk["get_ns"], "us"),
            "lookup_p99_per_run_us": [round(pct([x / 1e3 for x in r["get_ns"]], 99), 1) for r in runs],
            "lookup_median_per_run_us": [round(pct([x / 1e3 for x in r["get_ns"]], 50), 1) for r in runs],
            "same_key_us": dict(summary(lk["same_key_ns"], "us"), size=runs[0]["same_key_size"],
                                p999=round(pct([x / 1e3 for x in lk["same_key_ns"]], 99.9), 1)),
            "miss_us": summary(lk["miss_ns"], "us"),
            "parts_us": {"sql": summary(lk["sql_ns"], "us"), "decode": summary(lk["decode_ns"], "us"),
                         "hash": summary(lk["hash_ns"], "us"),
                         "sql_plus_decode": summary([a + b for a, b in zip(lk["sql_ns"], lk["decode_ns"])], "us")},
            "lookup_keys_mean_size": round(statistics.fmean(lk["sizes"])),
            "hash_algorithm": runs[0]["hash"],
            "by_size_us": by_size_table(lk["sizes"], lk["get_ns"]),
        })
        rec["layout"] = file_layout(path)
        if immutable_ok:
            rec["immutable"] = {"open_ms": summary([o["open_ns"] for o in imm_opens], "ms"),
                                "first_get_us": summary([o["first_get_ns"] for o in imm_opens], "us"),
                                "lookup_us": summary(imm_lk["get_ns"], "us"),
                                "sql_us": summary(imm_lk["sql_ns"], "us")}
        bundles.append(rec)
        lookups_big = dict(lk, entries=n)
        log(f"{n} entries: open median {rec['open_ms']['median']:.3f} ms p99 {rec['open_ms']['p99']:.3f} ms; "
            f"get median {rec['lookup_us']['median']:.1f} µs p99 {rec['lookup_us']['p99']:.1f} µs")

    study_n = 10000 if 10000 in sizes else sorted(sizes)[-1]
    log(f"page-size study on the {study_n}-entry bundle ...")
    ps_study = page_size_study(work / f"bench-{study_n}.kdb", work / f"bench-{study_n}.keys.json", warmup)
    ps_study[0]["lookup_us"] = next(b["lookup_us"] for b in bundles if b["entries"] == study_n)

    comp = results["compression"]
    log("codec timings on the distinct corpus ...")
    codec_timings(work, corpus, comp)
    big = bundles[-1]
    at = f"at {big['entries']:,} entries"
    targets = [
        {"name": f"open_bundle p99 {at}", "threshold": f"< {OPEN_TARGET_MS:g} ms",
         "measured": f"{big['open_ms']['p99']:.3f} ms (median {big['open_ms']['median']:.3f})"
                     + (f"; immutable=True: p99 {big['immutable']['open_ms']['p99']:.3f} ms"
                        if "immutable" in big else ""),
         "value": big["open_ms"]["p99"], "pass": big["open_ms"]["p99"] < OPEN_TARGET_MS},
        {"name": f"get() lookup+decompress p99 {at}", "threshold": f"< {LOOKUP_TARGET_US:g} µs",
         "measured": f"{big['lookup_us']['p99']:.1f} µs (median {big['lookup_us']['median']:.1f})"
                     + (f"; immutable=True: p99 {big['immutable']['lookup_us']['p99']:.1f} µs"
                        if "immutable" in big else ""),
         "value": big["lookup_us"]["p99"], "pass": big["lookup_us"]["p99"] < LOOKUP_TARGET_US},
        {"name": "stored size (zstd 19 + dictionary, dictionary included) / bzip2 -9, distinct corpus",
         "threshold": f"<= {SIZE_TARGET:g}", "measured": f"{comp['zstd19_dict_over_bzip2']:.3f}",
         "value": comp["zstd19_dict_over_bzip2"], "pass": comp["zstd19_dict_over_bzip2"] <= SIZE_TARGET},
    ]
    if big["entries"] < 100000:
        for t in targets[:2]:
            t["note"] = "judged below the 100k entries the target names (--quick or --sizes)"

    # -- observations computed from the numbers --
    obs = []
    p = big["parts_us"]
    alg = big["hash_algorithm"]
    share = p["hash"]["median"] / big["lookup_us"]["median"] if big["lookup_us"]["median"] else 0
    obs.append(f"At {big['entries']:,} entries a get() takes {big['lookup_us']['median']:.1f} µs median: SQLite fetch "
               f"{p['sql']['median']:.1f}, zstd decode {p['decode']['median']:.1f}, {alg} check "
               f"{p['hash']['median']:.1f} µs ({share:.0%} of the get).")
    tail = [r for r in big["by_size_us"] if r["range"] in ("32-64 kB", ">= 64 kB")]
    n_all = sum(r["n"] for r in big["by_size_us"])
    if tail:
        obs.append(f"The p99 ({big['lookup_us']['p99']:.1f} µs) is set by the size tail: "
                   f"{sum(r['n'] for r in tail) / n_all:.1%} of lookups hit cubins of 32 kB or more, whose get() "
                   f"median is " + " and ".join(f"{r['median']:.0f} µs ({r['range']})" for r in tail)
                   + f"; the decode scales with the uncompressed size (decode p99 {p['decode']['p99']:.1f} µs).")
    obs.append(f"For comparison, MIOpen's codec (bzip2 -9) decodes these cubins at "
               f"{comp['bzip2_9']['decode_us_per_blob']:.0f} µs per blob on average, against "
               f"{comp['zstd19_dict']['decode_us_per_blob']:.1f} µs for zstd 19 with "
               f"the dictionary.")
    q = big["same_key_us"]
    obs.append(f"Timing jitter on this VM: the same {q['size']:,}-byte cubin fetched repeatedly takes "
               f"{q['median']:.1f} µs median, {q['p99']:.1f} µs p99, {q['p999']:.1f} µs p99.9 and "
               f"{q['max']:.0f} µs at most, so jitter adds "
               f"little at p99 and dominates p99.9 and max. The per-process p99s of the random-key runs were "
               f"{', '.join(f'{x:.0f}' for x in big['lookup_p99_per_run_us'])} µs.")
    vc = comp["verify_cost"]
    obs.append(f"get() verifies every read with {alg} ({vc['xxh3_128_us_per_blob']:.2f} µs per blob on average for "
               f"XXH3-128; SHA-256, the first choice, costs {vc['sha256_us_per_blob']:.1f} µs and put the p99 over "
               "the target).")
    lay = big["layout"]
    base = ps_study[0]
    others = "; ".join(f"{v['page_size'] // 1024} kB pages: {_mb(v['file_bytes'])} MB, "
                       f"unused {_mb(v['unused_bytes'])} MB, get median {v['lookup_us']['median']:.1f} µs"
                       for v in sorted(ps_study[1:], key=lambda v: v["page_size"]))
    obs.append(f"The {big['entries']:,}-entry file is {lay['file_bytes'] / lay['blob_bytes']:.2f}x its blob bytes "
               f"(page size {lay['page_size']}): {_mb(lay['key_and_hash_bytes'])} MB keys and hashes in the rows, "
               f"{_mb(lay['index_bytes'])} MB index, {_mb(lay['unused_bytes'])} MB unused space in pages. The "
               f"{study_n:,}-entry bundle as written ({base['page_size'] // 1024} kB pages) is "
               f"{_mb(base['file_bytes'])} MB, "
               f"get median {base['lookup_us']['median']:.1f} µs; rewritten with {others}.")
    zd = comp["zstd19_dict"]
    mf = comp["miopen_like_file_bytes"]
    obs.append(f"The size target counts blob bytes. Comparing whole files for the distinct corpus, kdb's "
               f"zstd+dictionary "
               f"bundle is {zd['file_bytes']:,} B against {mf:,} B for the same cubins in a MIOpen-like bzip2 file "
               f"(4 kB pages, no kdb_meta): {zd['file_bytes'] / mf:.2f}x. Per-row costs (keys, hash, index, page "
               f"slack) are the same for both and dilute the codec's gain.")
    raw_rate = comp["zstd19_dict_encode_mb_per_s"]
    if big["entries"] >= 100000:
        obs.append(f"Building {big['entries']:,} entries ({big['raw_bytes'] / 1e9:.2f} GB raw) took "
                   f"{big['build_s']:.0f} s ({big['raw_mb_per_s']:.1f} MB/s): write_bundle compresses on one "
                   f"core at zstd 19 (measured {raw_rate:.1f} MB/s with the dictionary on this corpus).")
    dc = results.get("dictcost")
    if dc:
        same_n = next((b for b in bundles if b["entries"] == dc["entries"]), None)
        obs.append(f"The dictionary step alone (choose_dictionary over the {dc['samples']} blobs "
                   f"({dc['sample_bytes'] / 1e6:.1f} MB) write_bundle samples from {dc['entries']:,} entries) takes "
                   f"{dc['choose_dictionary_s']:.1f} s, of which train_dictionary {dc['train_dictionary_s']:.1f} s; "
                   f"the rest compresses the sample twice at zstd 19"
                   + (f" (the {dc['entries']:,}-entry build took {same_n['build_s']:.0f} s in all)."
                      if same_n else "."))
    res = {
        "benchmark": "kdb bundle micro-benchmark on real NVRTC cubins",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python scripts/bench_kdb.py"] + (sys.argv[1:] if argv is None else argv)),
        "machine": dict(machine_info(), loadavg_at_start=load_start, loadavg_at_end=_load_and_steal()[0],
                        steal_ticks_during_run=_load_and_steal()[1] - steal_start),
        "config": {"sizes": sizes, "open_runs": open_runs, "lookups": lookups, "lookup_runs": lookup_runs,
                   "warmup": warmup, "misses": n_misses,
                   "target": TARGET, "level": args.level or "kdb default", "jobs": jobs, "page_cache": "warm",
                   "timer": "time.perf_counter_ns inside fresh child processes"},
        "corpus": corpus.info,
        "entries_method": ("entry i = corpus cubin i % N with a 16-byte BLAKE2b(i) id appended after the ELF's "
                           "last header table; key = program name, cubin -D options + unique MIOpen-style shape "
                           "defines + -mcpu=sm_90"),
        "example_key": list(entry_key(sizes[-1] - 1, corpus)),
        "example_key_len": len(entry_key(sizes[-1] - 1, corpus)[1]),
        "gcd_100k": _gcd_training(100000, len(corpus.entries)),
        "bundles": bundles,
        "compression": comp,
        "dictionary_cost": results.get("dictcost"),
        "page_size_study": {"entries": study_n, "variants": ps_study},
        "targets": targets,
        "observations": obs,
        "json_name": "bench_kdb.json",
    }
    res["kdb_changed_during_run"] = kdb_sources_digest() != kdb_digest_start
    if res["kdb_changed_during_run"]:
        log("WARNING: kdb/*.py changed while the benchmark ran; the numbers mix two versions")
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    (out_dir / "bench_kdb.json").write_text(json.dumps(res, indent=1) + "\n")
    make_plot(res, lookups_big, out_dir / "bench_kdb.png")
    make_md(res, out_dir / "bench_kdb.md", "bench_kdb.png")
    log(f"wrote {out_dir / 'bench_kdb.json'}, .png, .md")
    for t in targets:
        log(f"target {t['name']}: {t['measured']} ({t['threshold']}) -> {'PASS' if t['pass'] else 'FAIL'}")
    return 0


def ps_study_n_text(n: int) -> str:
    return f"{n:,}-entry"


def _gcd_training(n: int, corpus_len: int) -> int:
    import math
    from kdbkit.kdb.writer import MAX_TRAINING_SAMPLES
    return math.gcd(max(1, n // MAX_TRAINING_SAMPLES), corpus_len)


if __name__ == "__main__":
    sys.exit(main())
