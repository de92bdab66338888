#!/usr/bin/env python3
"""Where a system-bundle hit spends its time, part by part, in fresh processes (CUDA GPU).

Each child process opens the device (untimed) and makes a ``Handle`` (timed, with its
preparation steps), then walks the steps of a system hit in ``Handle.program`` for the three
sample kernels, timing each part separately, and ends with a few experiments on the same
files (ways to open the bundle, raw system calls).
Medians over processes go to stdout and ``--out`` as JSON.

Usage: python scripts/profile_system_hit.py [--runs 12] [--out profile.json]   (needs a CUDA GPU;
scripts/run_gpu_checks.sh runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = {"relu": "relu_fwd", "reduce_sum": "reduce_sum", "sgemm": "sgemm_tiled"}


def child(system_dir: str) -> None:
    from kdbkit.runtime.backends.registry import discover_devices, open_backend
    from kdbkit.runtime.samples import SAMPLES

    device = next(d for d in discover_devices() if d.backend == "cuda")
    backend = open_backend(device)
    backend.synchronize()
    from cuda.bindings import driver

    from kdbkit.kdb import codec as _codec
    from kdbkit.runtime import kernel_sources
    from kdbkit.runtime.handle import Handle
    from kdbkit.runtime.program_key import ProgramRequest, program_key

    pc = time.perf_counter
    out: dict = {}

    def t(name, fn):
        t0 = pc()
        v = fn()
        out[name] = (pc() - t0) * 1e6
        return v

    handle = t("handle", lambda: Handle(backend=backend))
    for st in handle.prepare_steps:
        out[f"handle.{st.name}"] = st.ms * 1e3
    bundle = handle._system.search.get(0)
    for i, s in enumerate(SAMPLES):
        p = f"k{i}."
        request = t(p + "request", lambda: ProgramRequest(s.kernel_file, s.options))
        digest = handle._keys.digests[s.kernel_file]
        key = t(p + "key", lambda: program_key(request, target=device.target, source_digest=digest,
                                               compiler=bundle.metadata.compiler))
        row = t(p + "query", lambda: bundle._query_one(
            "SELECT kernel_blob, kernel_hash, uncompressed_size FROM kern_db WHERE kernel_name = ? AND kernel_args = ?",
            (key.kernel_name, key.kernel_args)))
        data = t(p + "decode", lambda: bundle._reader.decode(row[0], row[2]))
        t(p + "decode_again", lambda: bundle._reader.decode(row[0], row[2]))  # the same frame, caches warm
        t(p + "hash", lambda: _codec.digest(data, bundle.metadata.hash))
        t(p + "header_check", lambda: (data[:20] + data[48:52]) in backend._cubin_headers)
        t(p + "activate", backend._activate)
        err, mod = t(p + "cuModuleLoadData", lambda: driver.cuModuleLoadData(data))
        assert err == driver.CUresult.CUDA_SUCCESS
        err, fn = t(p + "cuModuleGetFunction", lambda: driver.cuModuleGetFunction(mod, ENTRY[s.name].encode()))
        assert err == driver.CUresult.CUDA_SUCCESS
        copy = bytes(bytearray(data))
        t(p + "reload_same_bytes", lambda: driver.cuModuleLoadData(copy))
        out[p + "blob_bytes"] = len(data)
    # Experiments on the same bundle file.
    import sqlite3

    path = Path(system_dir) / device.target.bundle_name()
    uri = path.as_uri() + "?mode=ro&immutable=1"
    t("x.stat", lambda: os.stat(path))
    t("x.is_file", lambda: path.is_file())
    c = t("x.connect_immutable", lambda: sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False))
    t("x.first_query", lambda: c.execute("SELECT value FROM kdb_meta WHERE key='format_version'").fetchone())
    t("x.second_query", lambda: c.execute("SELECT value FROM kdb_meta WHERE key='codec'").fetchone())
    raw = t("x.read_file", lambda: path.read_bytes())
    out["x.file_bytes"] = len(raw)
    m = t("x.connect_memory", lambda: sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False))
    t("x.deserialize", lambda: m.deserialize(raw))
    t("x.mem_first_query", lambda: m.execute("SELECT value FROM kdb_meta WHERE key='format_version'").fetchone())
    t("x.mem_second_query", lambda: m.execute("SELECT value FROM kdb_meta WHERE key='codec'").fetchone())
    t("x.mem_blob_query", lambda: m.execute("SELECT kernel_blob FROM kern_db WHERE rowid=2").fetchone())
    t("x.file_blob_query", lambda: c.execute("SELECT kernel_blob FROM kern_db WHERE rowid=2").fetchone())
    kfile = kernel_sources.kernels_dir() / "activation.c"
    t("x.stat_kernel", lambda: os.stat(kfile))

    def rd():
        with open(kfile, "rb") as f:
            return f.read()
    t("x.open_read_kernel", rd)
    t("x.open_read_kernel_again", rd)
    fd = os.open(kfile, os.O_RDONLY)
    t("x.os_read", lambda: os.pread(fd, 1 << 16, 0))
    os.close(fd)
    t("x.perf_counter_pair", lambda: pc())
    json.dump(out, sys.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    from kdbkit.packager.device_build import build_bundle
    from kdbkit.runtime.backends.registry import discover_devices
    from kdbkit.runtime.samples import SAMPLES

    work = Path(tempfile.mkdtemp())
    device = next(d for d in discover_devices() if d.backend == "cuda")
    build_bundle(device.target, [(s.kernel_file, s.options) for s in SAMPLES], work)
    # no prefetch: from the second process on, its worker would load the kernels timed here
    env = dict(os.environ, KDB_SYSTEM_DB_PATH=str(work), KDB_DISABLE_PREFETCH="1")
    runs = []
    for _ in range(a.runs):
        p = subprocess.run([sys.executable, __file__, "--child", str(work)], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr)
        runs.append(json.loads(p.stdout))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for k, v in med.items():
        print(f"{k:28} {v:10.1f}")
    if a.out:
        a.out.write_text(json.dumps({"median_us": med, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
