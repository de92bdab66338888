#!/usr/bin/env python3
"""The offline builder's figures: compile throughput and scaling, an unchanged rebuild, bundle sizes.

1. Throughput. One set of programs (``--all`` over a few targets of both compilers, NVRTC
   and clang; the builder's own plan order) is compiled into a fresh folder at ``-j 1`` and
   again at ``-j N`` (N: every CPU this process may use), both through
   :func:`kdbkit.packager.build.build`. At ``-j 1`` the compiles run in this process through
   an executor that times each one (the same in-process path ``parallel=1`` takes), which
   gives the per-program compile-time distribution; at ``-j N`` the builder's own process
   pool runs them. Target: speed-up >= 0.85 x N. The report explains a miss with the figures
   that bound it: the serial write phase, the longest program, and the makespan that the
   builder's submission order gives N workers (simulated from the measured compile times),
   and with the machine's own ceiling: a plain CPU-bound task (CPython compiling a large module) timed alone and then in
   N processes at once, whose slow-down bounds any N-way parallel work on this machine.
2. Unchanged rebuild. ``--all`` over >= 1000 programs (every NVRTC arch but sm_75, whose
   ``--all`` holds programs it cannot compile, and seven gfx arches) is built once; then the
   same build is timed again into the same folder, in this process (``plan()`` and
   ``build()`` apart) and as a fresh ``kdb build`` process. Target: < 2 s; it must compile nothing.
3. Sizes, per bundle of that build: the binaries raw, the bundle as written (zstd 19, a
   no dictionary, compressed in the workers, one arch-wide ``<arch>.kdb``), the same with a
   trained dictionary (``write_bundle``'s, where it pays), with bzip2 (MIOpen's codec), and without deduplication (one bundle per
   compute-unit count of the arch's known GPUs, as MIOpen's ``<arch>_<cu>`` packages).

Writes ``bench_build.json`` (every figure, machine, compilers), ``bench_build.md`` (tables,
PASS/FAIL lines, the command) and ``bench_build.png`` under ``--out``.

    python scripts/bench_build.py                 # full: about 5-7 minutes on 16 cores
    python scripts/bench_build.py --quick --out /tmp/bb   # small sets, a minute on 2 cores
    python scripts/bench_build.py --ceiling-only          # the machine's own scaling alone, seconds

Where a compiler is missing (the GPU machine's image has NVRTC but no clang-19), its targets
are left out and the report says so: the throughput set is then NVRTC's alone and the rebuild
set falls short of 1000 programs. To measure both there, carry Debian's clang-19, lld-19 and
their libraries (``apt-get download``; ``dpkg -x`` each into /).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import inspect
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SPEEDUP_SHARE = 0.85  # target: speed-up >= 0.85 x N
REBUILD_TARGET_S = 2.0
MIN_REBUILD_PROGRAMS = 1000
# A few hundred programs from both compilers: affordable at -j 1 (about 2-3 minutes).
THROUGHPUT_TARGETS = ("sm_80", "sm_90", "gfx90a", "gfx942")
THROUGHPUT_TARGETS_NVRTC_ONLY = ("sm_80", "sm_86", "sm_90", "sm_120")  # where no clang is installed
# sm_75 is left out: --all asks it for tensor-core programs (gemm_tc.cu, conv_igemm_tc.cu)
# that NVRTC cannot build for it, so every "unchanged" rebuild would compile them again.
REBUILD_NVRTC_SKIP = ("sm_75",)
REBUILD_GFX = ("gfx90a", "gfx942", "gfx1100", "gfx1201", "gfx908", "gfx1030", "gfx906", "gfx1101", "gfx1200")
QUICK_THROUGHPUT_TARGETS = ("sm_90", "gfx942")
QUICK_THROUGHPUT_STRIDE = 8  # every 8th program of the plan
QUICK_REBUILD_TARGETS = ("gfx90a",)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def buildable(targets) -> tuple[list[str], dict[str, str]]:
    """The targets a compiler here builds, and why each other one is left out."""
    from kdbkit.packager.targets import resolve_targets
    from kdbkit.packager.errors import TargetError
    from kdbkit.runtime.errors import CompilerUnavailableError

    ok, missing = [], {}
    for target in targets:
        try:
            resolve_targets([target])
            ok.append(target)
        except (CompilerUnavailableError, TargetError) as exc:
            missing[target] = exc.problem
    return ok, missing


def missing_note(missing: dict[str, str]) -> str:
    """``gfx90a, gfx942 left out (no compiler for gfx90a (...))``: the targets and the first reason."""
    first = next(iter(missing.values()))
    return f"{', '.join(missing)} left out ({first}{'; likewise the others' if len(missing) > 1 else ''})"


# -- machine -------------------------------------------------------------------------------------

def machine_info() -> dict:
    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("model name", "cpu MHz") and k.strip() not in cpu:
                cpu[k.strip()] = v.strip()
    except OSError:
        pass
    siblings = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        try:
            siblings.add(path.read_text().strip())
        except OSError:
            pass
    quota = None
    try:
        q, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        quota = None if q == "max" else int(q) / int(period)
    except (OSError, ValueError):
        pass
    from kdbkit.kdb.version import __version__
    from kdbkit.packager.targets import compiler_reports

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True)
    return {
        "cpu_model": cpu.get("model name", platform.processor()), "cpu_mhz": cpu.get("cpu MHz"),
        "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
        "physical_cores": len(siblings) or None, "cgroup_cpu_quota": quota, "load_average_at_start": os.getloadavg(),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "kdbkit": __version__, "commit": commit.stdout.strip() + (" (modified tree)" if dirty.stdout.strip() else ""),
        "compilers": [{"name": r.name, "backend": r.backend, "identity": r.identity, "missing": r.missing,
                       "archs": list(r.archs or ())} for r in compiler_reports()],
    }


# -- timing one build ------------------------------------------------------------------------------

class TimedInProcess(concurrent.futures.Executor):
    """Runs each call as it is submitted, in this process, as ``build(parallel=1)`` does, and
    records how long each took: ``times[i]`` for the i-th call, ``jobs[i]`` its job."""

    def __init__(self):
        self.times: list[float] = []
        self.jobs: list = []

    def submit(self, fn, /, *args, **kwargs):
        future = concurrent.futures.Future()
        t0 = time.perf_counter()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        self.times.append(time.perf_counter() - t0)
        self.jobs.append(args[1])  # _compile(compiler, job, source, expected, fresh)
        return future


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_build(jobs, compilers, out: Path, *, parallel: int | None = None, executor=None) -> dict:
    """One build() call: wall time, CPU seconds (this process and its reaped children: pool
    workers and the clang processes they ran), when each compile finished, and the result."""
    from kdbkit.packager import build as builder

    finished: list[float] = []
    t0 = time.perf_counter()
    cpu0 = _cpu_seconds()
    kwargs = {"executor": executor} if executor is not None else {"parallel": parallel}
    result = builder.build(jobs, compilers, out, progress=lambda done, total, failed: finished.append(
        time.perf_counter()), **kwargs)
    t1 = time.perf_counter()
    last = finished[-1] if finished else t0
    return {
        "wall_s": t1 - t0, "cpu_s": _cpu_seconds() - cpu0,
        "first_done_s": (finished[0] - t0) if finished else None,
        "compile_phase_s": last - t0,  # start to the last compile's completion (setup and pool included)
        "write_phase_s": t1 - last,  # bundles written by the calling process, one after another
        "compiled": result.compiled, "reused": result.reused, "failed": len(result.failures),
        "failures": [{"bundle": str(f.job.bundle), "program": str(f.job.request), "message": f.message[:300]}
                     for f in result.failures],
        "bundles": {t: str(p) for t, p in result.bundles.items()},
    }


def simulate(times: list[float], workers: int, longest_first: bool = False) -> float:
    """Makespan of ``times`` on ``workers`` workers that each take the next waiting job in order
    (the pool's queue): greedy list scheduling, in submission order or longest first."""
    import heapq

    order = sorted(times, reverse=True) if longest_first else times
    free = [0.0] * max(1, workers)
    for t in order:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free)


def distribution(values: list[float]) -> dict:
    if not values:
        return {}
    s = sorted(values)

    def q(p):
        return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]
    return {"count": len(s), "sum_s": sum(s), "mean_s": statistics.fmean(s), "min_s": s[0], "p50_s": q(0.5),
            "p90_s": q(0.9), "p99_s": q(0.99), "max_s": s[-1]}


# -- 1. throughput ---------------------------------------------------------------------------------

def throughput(targets: list[str], stride: int, workers: int, work: Path, notes: list[str]) -> dict:
    from kdbkit.packager import build as builder
    from kdbkit.packager.targets import resolve_targets

    targets, missing = buildable(targets)
    if missing:
        notes.append(f"Throughput set: {missing_note(missing)}.")
        if not any(t.startswith("gfx") for t in targets) and stride == 1:
            targets = buildable(THROUGHPUT_TARGETS_NVRTC_ONLY)[0]
            notes.append(f"With no clang here, the throughput set is NVRTC's alone: {', '.join(targets)}.")
    if not targets:
        raise SystemExit("no compiler here builds any throughput target: " + "; ".join(missing.values()))
    jobs, compilers = builder.plan(resolve_targets(targets))
    jobs = jobs[::stride]
    by_compiler: dict[str, int] = {}
    for job in jobs:
        by_compiler[compilers[job.bundle].name] = by_compiler.get(compilers[job.bundle].name, 0) + 1
    log(f"throughput set: {len(jobs)} programs over {', '.join(targets)} ({by_compiler})")

    # Warm up (untimed): each compiler loaded and its files in the page cache, for both runs alike.
    warm = {}
    for job in jobs:
        warm.setdefault(job.bundle.backend, job)
    builder.build(list(warm.values()), compilers, work / "warm", parallel=1)

    timed_executor = TimedInProcess() if "executor" in inspect.signature(builder.build).parameters else None
    log("-j 1 ...")
    one = timed_build(jobs, compilers, work / "j1", parallel=1, executor=timed_executor)
    log(f"-j 1: {one['wall_s']:.1f} s; -j {workers} ...")
    many = timed_build(jobs, compilers, work / f"j{workers}", parallel=workers)
    log(f"-j {workers}: {many['wall_s']:.1f} s")
    n = len(jobs)
    res = {
        "targets": targets, "programs": n, "programs_by_compiler": by_compiler, "workers": workers,
        "jN_average_busy_cpus": many["cpu_s"] / many["wall_s"], "j1_average_busy_cpus": one["cpu_s"] / one["wall_s"],
        "order": "the builder's plan order (bundle by bundle, kernel file and options sorted)",
        "j1": one, "jN": many,
        "j1_programs_per_s": n / one["wall_s"], "jN_programs_per_s": n / many["wall_s"],
        "speedup": one["wall_s"] / many["wall_s"], "target_speedup": SPEEDUP_SHARE * workers,
    }
    res["pass"] = res["speedup"] >= res["target_speedup"]
    if timed_executor is not None:
        times = timed_executor.times
        per = [{"bundle": str(job.bundle), "compiler": compilers[job.bundle].name,
                "kernel_file": job.request.kernel_file, "options": " ".join(job.request.options), "s": t}
               for job, t in zip(timed_executor.jobs, times)]
        res["per_program"] = per
        res["distribution"] = {"all": distribution(times)} | {
            name: distribution([p["s"] for p in per if p["compiler"] == name]) for name in by_compiler}
        res["longest"] = sorted(per, key=lambda p: -p["s"])[:8]
        serial_write = one["write_phase_s"]
        compile_sum = sum(times)
        res["bounds"] = {
            "compile_sum_s": compile_sum,
            "ideal_s": one["wall_s"] / workers,  # perfect scaling of the whole -j 1 run
            "ideal_compiles_s": compile_sum / workers,
            "longest_program_s": max(times),
            "serial_write_s": serial_write,
            # The writes stay serial at any -j: the best speed-up the builder's structure allows.
            "amdahl_speedup": one["wall_s"] / (serial_write + (one["wall_s"] - serial_write) / workers),
            "makespan_plan_order_s": simulate(times, workers),
            "makespan_longest_first_s": simulate(times, workers, longest_first=True),
        }
        b = res["bounds"]
        b["predicted_jN_s"] = b["makespan_plan_order_s"] + serial_write
        b["cpu_j1_s"], b["cpu_jN_s"] = one["cpu_s"], many["cpu_s"]
    return res


def _probe_task(seed: int) -> float:
    """One unit of plain CPU work that behaves like a compiler's: CPython compiling a generated
    module of 3,000 functions (a parser and code generator in C, allocating and walking trees
    well beyond the caches). Returns its wall time."""
    body = "\n".join(f"def f{seed}_{i}(a, b):\n    c = [a * {i} + b for _ in range(3)]\n"
                     f"    if a > {i}:\n        return {{'k': c, 'v': (a, b, {i})}}\n    return sum(c) - {i}\n"
                     for i in range(3000))
    t0 = time.perf_counter()
    compile(body, f"<probe {seed}>", "exec")
    return time.perf_counter() - t0


def machine_ceiling(workers: int, tasks_per_worker: int = 6) -> dict:
    """How well this machine scales plain CPU-bound work, whatever the builder does: the median
    time of the probe task run alone, then with ``workers`` processes running it at once (each
    phase in its own pool, after a warm-up task per worker). The ratio is what every task pays
    for sharing the machine (turbo clocks falling as more cores run, shared caches and memory
    bandwidth, hyper-threads), so ``workers / ratio`` is the best speed-up any N-way parallel
    work can reach here: the builder's ceiling."""
    def phase(n: int) -> list[float]:
        with concurrent.futures.ProcessPoolExecutor(n) as pool:
            list(pool.map(_probe_task, range(n)))  # warm-up: the workers started, their first compile done
            return list(pool.map(_probe_task, range(n * tasks_per_worker)))

    alone, together = phase(1), phase(workers)
    ratio = statistics.median(together) / statistics.median(alone)
    return {"task": "CPython compiling a 3,000-function module", "workers": workers,
            "alone_s": statistics.median(alone), "together_s": statistics.median(together), "slowdown": ratio,
            "ceiling_speedup": workers / ratio}


# -- 2. unchanged rebuild ----------------------------------------------------------------------------

def rebuild_targets(quick: bool, notes: list[str]) -> list[str]:
    """Arch-wide targets until --all holds at least MIN_REBUILD_PROGRAMS programs: every arch
    NVRTC reports (but REBUILD_NVRTC_SKIP), then gfx arches clang builds."""
    from kdbkit.packager import build as builder
    from kdbkit.packager.targets import compiler_reports, resolve_targets

    if quick:
        chosen, missing = buildable(QUICK_REBUILD_TARGETS)
        if not chosen:
            chosen, missing = buildable(["sm_90"])
        return chosen
    archs = {r.name: list(r.archs or ()) for r in compiler_reports() if r.identity}
    chosen = [a for a in archs.get("nvrtc", []) if a not in REBUILD_NVRTC_SKIP]
    count = len(builder.plan(resolve_targets(chosen))[0]) if chosen else 0
    gfx, missing = buildable(REBUILD_GFX)
    for arch in gfx:
        if count >= MIN_REBUILD_PROGRAMS:
            break
        chosen.append(arch)
        count += len(builder.plan(resolve_targets([arch]))[0])
    if count < MIN_REBUILD_PROGRAMS:
        notes.append(f"The rebuild set holds {count} programs, fewer than {MIN_REBUILD_PROGRAMS}: "
                     + (missing_note(missing) if missing else "no more arches here")
                     + f". ({', '.join(REBUILD_NVRTC_SKIP)} stays out: its --all fails to compile some programs, "
                     "which every rebuild would compile again.)")
    return chosen


def kdb_command() -> list[str]:
    """The ``kdb`` console script beside this Python or on PATH, else the module it runs."""
    here = Path(sys.executable).parent / "kdb"
    if here.exists():
        return [str(here)]
    found = shutil.which("kdb")
    return [found] if found else [sys.executable, "-m", "kdbkit.runtime.cli.app"]


def rebuild(targets: list[str], workers: int, work: Path, repeats: int) -> dict:
    from kdbkit.packager import build as builder
    from kdbkit.packager.targets import resolve_targets

    out = work / "rebuild"
    resolved = resolve_targets(targets)
    t0 = time.perf_counter()
    jobs, compilers = builder.plan(resolved)
    cold_plan = time.perf_counter() - t0
    log(f"rebuild set: {len(jobs)} programs over {len(targets)} targets; first build at -j {workers} ...")
    cold = timed_build(jobs, compilers, out, parallel=workers)
    log(f"first build: {cold['wall_s']:.1f} s, {cold['compiled']} compiled, {cold['failed']} failed")
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.kdb")}

    in_process = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jobs, compilers = builder.plan(resolved)
        t1 = time.perf_counter()
        again = timed_build(jobs, compilers, out, parallel=workers)
        in_process.append({"plan_s": t1 - t0, "build_s": again["wall_s"], "total_s": time.perf_counter() - t0,
                           "compiled": again["compiled"], "reused": again["reused"], "failed": again["failed"]})
    rewritten = sorted(p.name for p in out.glob("*.kdb") if stamps.get(p.name) != p.stat().st_mtime_ns)

    cmd = kdb_command() + ["build", *sum((["--target", t] for t in targets), []), "--all", "-o", str(out),
                           "-j", str(workers), "--json"]
    env = {k: v for k, v in os.environ.items() if k != "KDB_COMPILE_PARALLEL_LEVEL"}
    processes = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
        wall = time.perf_counter() - t0
        try:
            printed = json.loads(proc.stdout)
        except json.JSONDecodeError:
            printed = {"stdout": proc.stdout[-500:], "stderr": proc.stderr[-2000:]}
        processes.append({"wall_s": wall, "rc": proc.returncode, "compiled": printed.get("compiled"),
                          "reused": printed.get("reused"), "failed": printed.get("failed"),
                          **({"error": printed} if "stdout" in printed else {})})
    med = {k: statistics.median(r[k] for r in in_process) for k in ("plan_s", "build_s", "total_s")}
    res = {
        "targets": targets, "programs": len(jobs), "workers": workers, "repeats": repeats,
        "first_build": cold | {"plan_s": cold_plan, "programs_per_s": cold["compiled"] / cold["wall_s"]},
        "in_process": in_process, "in_process_median": med,
        "process": processes, "process_median_s": statistics.median(p["wall_s"] for p in processes),
        "command": " ".join(["kdb"] + [a if a != str(out) else "OUT" for a in cmd[len(kdb_command()):]]),
        "bundles_rewritten": rewritten,
        "compiled_nothing": all(r["compiled"] == 0 for r in in_process) and all(
            p["compiled"] == 0 for p in processes),
    }
    res["pass_build"] = med["build_s"] < REBUILD_TARGET_S and res["compiled_nothing"]
    res["pass_plan_and_build"] = med["total_s"] < REBUILD_TARGET_S and res["compiled_nothing"]
    res["pass_process"] = res["process_median_s"] < REBUILD_TARGET_S and res["compiled_nothing"] and all(
        p["rc"] == 0 for p in processes)
    res["bundle_paths"] = cold["bundles"]
    return res


# -- 3. sizes --------------------------------------------------------------------------------------

def _sizes_of(bundle_path: str, scratch: str) -> dict:
    """Raw, written, with-dictionary and bzip2 sizes of one bundle, and of the wheel ``kdb
    package`` makes of each (runs in a worker process)."""
    from kdbkit.kdb import write_bundle
    from kdbkit.kdb.bundle import Bundle
    from kdbkit.packager.wheel import write_package

    with Bundle.open(bundle_path) as bundle:
        meta = bundle.metadata
        entries = list(bundle.items())
    scratch_dir = Path(scratch)
    name = Path(bundle_path).name
    common = dict(compiler=meta.compiler, binary_format=meta.binary_format, sources=meta.source_digests or None)
    with_dict = write_bundle(scratch_dir / f"dict-{name}", meta.target, entries, dictionary=True, **common)
    with Bundle.open(with_dict) as trained:
        dictionary_bytes = trained.metadata.dictionary_size
    bzip2 = write_bundle(scratch_dir / f"bzip2-{name}", meta.target, entries, codec="bzip2", **common)

    def wheel_bytes(bundle: Path, kind: str) -> int:
        return write_package(bundle, scratch_dir / f"wheels-{kind}-{name}").stat().st_size

    return {"programs": len(entries), "raw_bytes": sum(len(b) for _, _, b in entries),
            "written_bytes": os.path.getsize(bundle_path), "dictionary_bytes": dictionary_bytes,
            "dict_file_bytes": with_dict.stat().st_size, "bzip2_bytes": bzip2.stat().st_size,
            "wheel_bytes": wheel_bytes(Path(bundle_path), "written"), "dict_wheel_bytes": wheel_bytes(with_dict, "dict"),
            "bzip2_wheel_bytes": wheel_bytes(bzip2, "bzip2"), "compiler": meta.compiler}


def sizes(bundle_paths: dict[str, str], workers: int, work: Path) -> dict:
    from kdbkit.packager.targets import KNOWN_GPUS

    scratch = work / "sizes"
    scratch.mkdir()
    with concurrent.futures.ProcessPoolExecutor(max(1, min(workers, len(bundle_paths)))) as pool:
        futures = {target: pool.submit(_sizes_of, path, str(scratch)) for target, path in bundle_paths.items()}
        rows = {target: f.result() for target, f in futures.items()}
    for target, row in rows.items():
        arch = target.split("_")[0] if target.startswith("gfx") else "_".join(target.split("_")[:2])
        gpus = [g for g in KNOWN_GPUS if g.arch == arch]
        row["known_gpus"] = [g.name for g in gpus]
        row["cu_counts"] = sorted({g.cu for g in gpus})
        # What MIOpen's layout would ship: one <arch>_<cu> bundle per count, each holding the
        # same code objects (the programs do not depend on the count).
        row["per_cu_bytes"] = len(row["cu_counts"]) * row["written_bytes"] if gpus else None
        row["per_cu_wheel_bytes"] = len(row["cu_counts"]) * row["wheel_bytes"] if gpus else None
    total = {k: sum(r[k] for r in rows.values()) for k in ("programs", "raw_bytes", "written_bytes", "dict_file_bytes",
                                                           "bzip2_bytes", "wheel_bytes", "dict_wheel_bytes",
                                                           "bzip2_wheel_bytes")}
    known = [r for r in rows.values() if r["per_cu_bytes"]]
    total["per_cu_bytes_known_archs"] = sum(r["per_cu_bytes"] for r in known)
    total["written_bytes_known_archs"] = sum(r["written_bytes"] for r in known)
    total["per_cu_wheel_bytes_known_archs"] = sum(r["per_cu_wheel_bytes"] for r in known)
    total["wheel_bytes_known_archs"] = sum(r["wheel_bytes"] for r in known)
    return {"per_target": rows, "total": total, "max_wheel_bytes_default": _default_wheel_limit()}


def _default_wheel_limit() -> int:
    from kdbkit.packager.distribute import DEFAULT_MAX_WHEEL_BYTES

    return DEFAULT_MAX_WHEEL_BYTES


def sizes_only(targets: list[str], workers: int, work: Path) -> dict:
    """The rebuild set built once (not timed) and its sizes measured: ``--sizes-only``."""
    from kdbkit.packager import build as builder
    from kdbkit.packager.targets import resolve_targets

    jobs, compilers = builder.plan(resolve_targets(targets))
    log(f"sizes set: {len(jobs)} programs over {len(targets)} targets, built at -j {workers} ...")
    built = timed_build(jobs, compilers, work / "rebuild", parallel=workers)
    log(f"built in {built['wall_s']:.1f} s ({built['compiled']} compiled, {built['failed']} failed); sizes ...")
    return sizes(built["bundles"], workers, work)


# -- report ----------------------------------------------------------------------------------------

def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def _load(values) -> str:
    return "-" if not values else " / ".join(f"{v:.2f}" for v in values)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(res: dict) -> str:
    m, t, r, s = res["machine"], res["throughput"], res["rebuild"], res["sizes"]
    n = t["workers"]
    lines = [
        "# Offline build: throughput, unchanged rebuild, bundle sizes", "",
        f"Made on {res['date']} at commit {m['commit']} by `{res['command']}`.",
        f"Machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['physical_cores'] or '?'} physical cores, "
        f"{m['usable_cpus']} usable by this process, cgroup quota {m['cgroup_cpu_quota'] or 'none'}), {m['os']}, "
        f"Python {m['python']}.",
        "Compilers: " + "; ".join(f"{c['name']}: {c['identity'] or 'missing (' + str(c['missing']) + ')'}"
                                  for c in m["compilers"]) + ".",
        f"Load average (1, 5, 15 min) at the start {_load(m.get('load_average_at_start'))}, at the end "
        f"{_load(m.get('load_average_at_end'))}; whole run {res['elapsed_s']:.0f} s.",
        "Raw figures: `bench_build.json`; plot: `bench_build.png`."
        + (" **Quick run (small sets).**" if res["quick"] else ""),
        *(([""] + [f"Note: {note}" for note in res["notes"]]) if res.get("notes") else []),
        "", "## Targets", "",
        f"- {verdict(t['pass'])}: speed-up at -j {n} is {t['speedup']:.2f}x (target >= {t['target_speedup']:.1f}x "
        f"= {SPEEDUP_SHARE} x {n}) on {t['programs']} programs.",
        *([f"- The machine's own ceiling: a plain CPU-bound task ({res['ceiling']['task']}) took "
           f"{res['ceiling']['slowdown']:.2f}x its time alone when {res['ceiling']['workers']} ran at once, so no "
           f"{n}-way parallel work can exceed {res['ceiling']['ceiling_speedup']:.2f}x here; the builder reached "
           f"{t['speedup'] / res['ceiling']['ceiling_speedup']:.2f} of that."] if "ceiling" in res else []),
        f"- {verdict(r['pass_build'])}: an unchanged rebuild of {r['programs']} programs, `build()` in the process: "
        f"{r['in_process_median']['build_s']:.2f} s (target < {REBUILD_TARGET_S:g} s; plan() before it "
        f"{r['in_process_median']['plan_s']:.2f} s, {verdict(r['pass_plan_and_build'])} for both together: "
        f"{r['in_process_median']['total_s']:.2f} s).",
        f"- {verdict(r['pass_process'])}: the same rebuild as a fresh `kdb build` process: "
        f"{r['process_median_s']:.2f} s (target < {REBUILD_TARGET_S:g} s).",
        f"- The rebuilds compiled nothing: {'yes' if r['compiled_nothing'] else 'NO'}; bundles rewritten: "
        f"{', '.join(r['bundles_rewritten']) or 'none'}.",
        "", f"## 1. Throughput: -j 1 against -j {n}", "",
        f"The set: `--all` over {', '.join(t['targets'])}: {t['programs']} programs "
        f"({', '.join(f'{v} {k}' for k, v in t['programs_by_compiler'].items())}), in {t['order']}; each run "
        "into a fresh folder, after an untimed warm-up compile per compiler. At -j 1 the compiles run in this "
        "process (as `build(parallel=1)` does) through an executor that times each; at -j N, the builder's "
        "process pool.", "",
        "| run | wall s | programs/s | compile phase s | write phase s | CPU s | failed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, run, rate in (("-j 1", t["j1"], t["j1_programs_per_s"]), (f"-j {n}", t["jN"], t["jN_programs_per_s"])):
        lines.append(f"| {label} | {run['wall_s']:.1f} | {rate:.2f} | {run['compile_phase_s']:.1f} | "
                     f"{run['write_phase_s']:.2f} | {run['cpu_s']:.0f} | {run['failed']} |")
    lines += ["", f"Speed-up {t['speedup']:.2f}x; {t['speedup'] / n:.2f} of ideal. CPUs busy on average: "
              f"{t['j1_average_busy_cpus']:.2f} at -j 1, {t['jN_average_busy_cpus']:.2f} of {n} at -j {n}. "
              "\"Compile phase\": from the call to the last compile's completion (pool start included); "
              "\"write phase\": from then to the return (the bundles' rows, compressed by the workers, inserted "
              "one bundle after another by the calling process). "
              "CPU s: this process and its reaped children (pool workers, clang)."]
    if "distribution" in t:
        b = t["bounds"]
        lines += ["", "Per-program compile time at -j 1 (seconds):", "",
                  "| compiler | programs | sum | mean | p50 | p90 | p99 | max |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, d in t["distribution"].items():
            lines.append(f"| {name} | {d['count']} | {d['sum_s']:.1f} | {d['mean_s']:.3f} | {d['p50_s']:.3f} | "
                         f"{d['p90_s']:.3f} | {d['p99_s']:.3f} | {d['max_s']:.2f} |")
        lines += ["", "Longest programs: " + "; ".join(
            f"{p['kernel_file']} for {p['bundle']} {p['s']:.2f} s" for p in t["longest"][:5]) + ".", "",
            f"What bounds -j {n}, from the -j 1 figures:", "",
            "| bound | s |", "|---|---:|",
            f"| ideal (-j 1 wall / {n}) | {b['ideal_s']:.2f} |",
            f"| the compiles alone, perfectly spread ({b['compile_sum_s']:.1f} s / {n}) "
            f"| {b['ideal_compiles_s']:.2f} |",
            f"| the longest program | {b['longest_program_s']:.2f} |",
            f"| the serial write phase | {b['serial_write_s']:.2f} |",
            f"| makespan of the measured compiles on {n} workers in the builder's order "
            f"| {b['makespan_plan_order_s']:.2f} |",
            f"| the same, longest first | {b['makespan_longest_first_s']:.2f} |",
            f"| predicted -j {n} (that makespan + the writes) | {b['predicted_jN_s']:.2f} |",
            f"| measured -j {n} | {t['jN']['wall_s']:.2f} |", "",
            f"Best speed-up the serial writes allow (Amdahl): {b['amdahl_speedup']:.2f}x. CPU seconds: "
            f"{b['cpu_j1_s']:.0f} at -j 1, {b['cpu_jN_s']:.0f} at -j {n} "
            f"({b['cpu_jN_s'] / max(b['cpu_j1_s'], 1e-9):.2f}x: per-compile cost under load, pool and pickling)."]
        if not t["pass"]:
            lines += ["", "**Why the target is missed**: " + why_missed(t, m, res.get("ceiling"))]
    lines += ["", f"## 2. Unchanged rebuild ({r['programs']} programs)", "",
              f"`--all` over {', '.join(r['targets'])}. First build at -j {n}: {r['first_build']['wall_s']:.1f} s "
              f"({r['first_build']['programs_per_s']:.1f} programs/s, {r['first_build']['compiled']} compiled, "
              f"{r['first_build']['failed']} failed; write phase {r['first_build']['write_phase_s']:.1f} s). Then "
              f"{r['repeats']} unchanged rebuilds into the same folder, each way (medians):", "",
              "| how | s | compiled |", "|---|---:|---:|",
              f"| `plan()` in the process | {r['in_process_median']['plan_s']:.3f} | - |",
              f"| `build()` in the process | {r['in_process_median']['build_s']:.3f} | "
              f"{max(x['compiled'] for x in r['in_process'])} |",
              f"| `plan()` + `build()` | {r['in_process_median']['total_s']:.3f} | - |",
              f"| `{r['command']}` as a fresh process | {r['process_median_s']:.3f} | "
              f"{max((x['compiled'] or 0) for x in r['process'])} |"]
    if r["first_build"]["failures"]:
        lines += ["", "Failures of the first build: " + "; ".join(
            f"{f['program']} for {f['bundle']}" for f in r["first_build"]["failures"][:10])]
    measured = s.get("measured")
    lines += ["", "## 3. Bundle sizes (MB), per target of the rebuild set", ""]
    if measured:
        lines += [f"Sections 3 and 3b: measured by `{measured['command']}` on {measured['date']} "
                  f"({measured['machine']}), apart from sections 1 and 2; the rebuild set built here once.", ""]
    lines += [
              "Raw: the binaries as compiled. Written: the arch-wide `<arch>.kdb` as `kdb build` writes it "
              "(zstd 19 compressed by the build's workers, no dictionary). With dict: the same entries through "
              "`write_bundle(..., dictionary=True)`, a trained 32 kB dictionary where it pays (its size counted in; "
              "dict kB 0 where it does not pay). bzip2: `write_bundle(..., codec=\"bzip2\")`, MIOpen's "
              "codec. Per CU count: what one bundle per compute-unit count of the arch's known GPUs "
              "(`packager/targets.py` KNOWN_GPUS) would hold, the same programs in each: count x written.", "",
              "| target | programs | raw | written | dict kB | with dict | bzip2 | raw/written | known GPUs (CU counts) "
              "| per CU count |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for target, row in s["per_target"].items():
        gpus = f"{len(row['known_gpus'])} ({', '.join(map(str, row['cu_counts']))})" if row["known_gpus"] else "none"
        lines.append(f"| {target} | {row['programs']} | {_mb(row['raw_bytes'])} | {_mb(row['written_bytes'])} | "
                     f"{row['dictionary_bytes'] / 1024:.0f} | {_mb(row['dict_file_bytes'])} | "
                     f"{_mb(row['bzip2_bytes'])} | "
                     f"{row['raw_bytes'] / row['written_bytes']:.2f} | {gpus} | {_mb(row['per_cu_bytes'])} |")
    tot = s["total"]
    lines += [f"| **all** | {tot['programs']} | {_mb(tot['raw_bytes'])} | {_mb(tot['written_bytes'])} | | "
              f"{_mb(tot['dict_file_bytes'])} | {_mb(tot['bzip2_bytes'])} | "
              f"{tot['raw_bytes'] / tot['written_bytes']:.2f} "
              f"| | |", "",
              f"Over all targets: written is {tot['written_bytes'] / tot['raw_bytes']:.3f} of raw, "
              f"{tot['written_bytes'] / tot['dict_file_bytes']:.3f} of the file with a dictionary and "
              f"{tot['written_bytes'] / tot['bzip2_bytes']:.3f} of bzip2's."]
    if tot["per_cu_bytes_known_archs"]:
        lines.append(f"For the arches with known GPUs, one bundle per CU count would take "
                     f"{_mb(tot['per_cu_bytes_known_archs'])} MB against {_mb(tot['written_bytes_known_archs'])} MB "
                     f"arch-wide ({tot['per_cu_bytes_known_archs'] / tot['written_bytes_known_archs']:.2f}x).")
    if "wheel_bytes" in tot:
        lines += _package_table(s)
    return "\n".join(lines) + "\n"


def _package_table(s: dict) -> list[str]:
    """The wheels `kdb package` writes of each bundle variant, per target."""
    tot, limit = s["total"], s.get("max_wheel_bytes_default")
    lines = ["", "## 3b. Package sizes (MB): the wheel `kdb package` writes, per target", "","Each variant of section 3 packaged as `kdb package` packages it (manifest, provenance, deflate): "
              "wheel (zstd 19, no dictionary, as `kdb build` writes), with dict, bzip2 (MIOpen's codec), and "
              "without deduplication across CU counts (one package per CU count of the arch's known GPUs, as "
              "MIOpen's `miopenkernels-<arch>-<cu>`: count x wheel).", "",
              "| target | programs | wheel | with dict | bzip2 | wheel/bzip2 | per CU count |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for target, row in s["per_target"].items():
        lines.append(f"| {target} | {row['programs']} | {_mb(row['wheel_bytes'])} | {_mb(row['dict_wheel_bytes'])} | "
                     f"{_mb(row['bzip2_wheel_bytes'])} | {row['wheel_bytes'] / row['bzip2_wheel_bytes']:.3f} | "
                     f"{_mb(row['per_cu_wheel_bytes'])} |")
    lines += [f"| **all** | {tot['programs']} | {_mb(tot['wheel_bytes'])} | {_mb(tot['dict_wheel_bytes'])} | "
              f"{_mb(tot['bzip2_wheel_bytes'])} | {tot['wheel_bytes'] / tot['bzip2_wheel_bytes']:.3f} | |", ""]
    largest = max(s["per_target"].items(), key=lambda kv: kv[1]["wheel_bytes"])
    lines.append(f"Over all targets the wheels take {tot['wheel_bytes'] / tot['bzip2_wheel_bytes']:.3f} of bzip2's and "
                 f"{tot['wheel_bytes'] / tot['dict_wheel_bytes']:.3f} of the dictionary's. The largest, {largest[0]}'s, "
                 f"is {_mb(largest[1]['wheel_bytes'])} MB"
                 + (f", under `kdb package`'s default limit of {limit / (1 << 30):g} GiB: no target is split "
                    "(`--max-wheel-size` splits a larger one into parts installed together)." if limit else "."))
    if tot.get("per_cu_wheel_bytes_known_archs"):
        lines.append(f"For the arches with known GPUs, one package per CU count would take "
                     f"{_mb(tot['per_cu_wheel_bytes_known_archs'])} MB against {_mb(tot['wheel_bytes_known_archs'])} MB "
                     f"arch-wide ({tot['per_cu_wheel_bytes_known_archs'] / tot['wheel_bytes_known_archs']:.2f}x).")
    return lines


def why_missed(t: dict, m: dict, ceiling: dict | None = None) -> str:
    b, n = t["bounds"], t["workers"]
    parts = [f"at -j {n} the run took {t['jN']['wall_s']:.2f} s against an ideal {b['ideal_s']:.2f} s."]
    if ceiling:
        parts.append(f"Plain CPU-bound work slows down {ceiling['slowdown']:.2f}x per task with {ceiling['workers']} "
                     f"processes at once on this machine, which caps any {n}-way speed-up at "
                     f"{ceiling['ceiling_speedup']:.2f}x.")
    if b["serial_write_s"] > 0.05 * t["jN"]["wall_s"]:
        parts.append(f"The bundles are written serially after the compiles ({t['jN']['write_phase_s']:.2f} s "
                     f"at -j {n}, "
                     f"{b['serial_write_s']:.2f} s at -j 1), which caps the speed-up at {b['amdahl_speedup']:.2f}x.")
    if b["makespan_plan_order_s"] > 1.1 * b["ideal_compiles_s"]:
        parts.append(f"The compiles alone need {b['makespan_plan_order_s']:.2f} s on {n} workers in the builder's "
                     "order "
                     f"(the longest program takes {b['longest_program_s']:.2f} s; perfectly spread they would take "
                     f"{b['ideal_compiles_s']:.2f} s; longest first {b['makespan_longest_first_s']:.2f} s).")
    overhead = t["jN"]["compile_phase_s"] - b["makespan_plan_order_s"]
    parts.append(f"The measured compile phase was {t['jN']['compile_phase_s']:.2f} s, {overhead:+.2f} s against that "
                 "makespan (pool start, per-compile slow-down under load: "
                 f"{b['cpu_jN_s'] / max(b['cpu_j1_s'], 1e-9):.2f}x "
                 f"the CPU seconds of -j 1; {t['jN_average_busy_cpus']:.2f} CPUs busy on average of {n}).")
    load = m.get("load_average_at_start") or (0,)
    if load[0] > 0.5:
        parts.append(f"Other processes were running: load average {load[0]:.2f} at the start.")
    if m["physical_cores"] and m["physical_cores"] < n:
        parts.append(f"The machine has {m['physical_cores']} physical cores for {n} logical CPUs: hyper-threads share "
                     "a core's execution units.")
    return " ".join(parts)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, r, s = res["throughput"], res["rebuild"], res["sizes"]
    n = t["workers"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    labels = ["-j 1", f"-j {n}", f"target\n({SPEEDUP_SHARE} x {n} x -j 1)", f"ideal\n({n} x -j 1)"]
    values = [t["j1_programs_per_s"], t["jN_programs_per_s"], t["j1_programs_per_s"] * t["target_speedup"],
              t["j1_programs_per_s"] * n]
    bars = ax.bar(labels, values, color=["#888", "#1f77b4", "#d62728", "#ccc"])
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("programs / s")
    ax.set_title(f"Throughput, {t['programs']} programs: speed-up {t['speedup']:.2f}x")
    ax = axes[0][1]
    if "per_program" in t:
        import numpy as np

        times = [p["s"] for p in t["per_program"]]
        bins = np.logspace(np.log10(max(min(times), 1e-3)), np.log10(max(times)) + 0.01, 30)
        for name in t["programs_by_compiler"]:
            ax.hist([p["s"] for p in t["per_program"] if p["compiler"] == name], bins=bins, alpha=0.6, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("compile time per program at -j 1 (s, log)")
        ax.set_ylabel("programs")
        ax.legend()
    ax.set_title("Per-program compile time")
    ax = axes[1][0]
    med = r["in_process_median"]
    labels = ["plan()", "build()", "plan()+build()", "kdb build\n(fresh process)"]
    values = [med["plan_s"], med["build_s"], med["total_s"], r["process_median_s"]]
    bars = ax.bar(labels, values, color="#2ca02c")
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax.axhline(REBUILD_TARGET_S, color="red", linestyle="--", label=f"target {REBUILD_TARGET_S:g} s")
    ax.set_ylabel("s")
    ax.set_title(f"Unchanged rebuild, {r['programs']} programs")
    ax.legend()
    ax = axes[1][1]
    targets = list(s["per_target"])
    kinds = [("raw_bytes", "raw"), ("per_cu_bytes", "one per CU count"), ("bzip2_bytes", "bzip2"),
             ("dict_file_bytes", "zstd 19 + dictionary"), ("written_bytes", "as written")]
    width = 0.8 / len(kinds)
    for i, (key, label) in enumerate(kinds):
        xs = [j + (i - len(kinds) / 2 + 0.5) * width for j in range(len(targets))]
        ax.bar(xs, [(s["per_target"][tg][key] or 0) / 1e6 for tg in targets], width=width, label=label)
    ax.set_xticks(range(len(targets)), targets, rotation=60, fontsize=7)
    ax.set_ylabel("MB")
    ax.set_title("Bundle sizes per target")
    ax.legend(fontsize=7)
    fig.suptitle(f"kdb build on {res['machine']['cpu_model']}, {res['machine']['usable_cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the JSON, PNG and report")
    ap.add_argument("--quick", action="store_true", help="small sets, for a local check")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="N (default: every CPU this process may use)")
    ap.add_argument("--throughput-targets", help="comma-separated targets of the -j 1 / -j N set (default: "
                    + ",".join(THROUGHPUT_TARGETS) + ")")
    ap.add_argument("--rebuild-targets", help="comma-separated targets of the rebuild set (default: every NVRTC arch "
                    f"but {', '.join(REBUILD_NVRTC_SKIP)}, then gfx arches until >= {MIN_REBUILD_PROGRAMS} programs)")
    ap.add_argument("--repeats", type=int, default=None, help="unchanged rebuilds per way (default 3, quick 2)")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG and the report from the JSON in --out")
    ap.add_argument("--ceiling-only", action="store_true", help="measure only the machine's own scaling (seconds) "
                    "and print it")
    ap.add_argument("--sizes-only", action="store_true", help="build the rebuild set once and measure only its "
                    "bundle and package sizes, replacing section 3 of the bench_build.json in --out (the other "
                    "sections keep their own run)")
    args = ap.parse_args()
    if args.ceiling_only:
        print(json.dumps(machine_ceiling(args.jobs or len(os.sched_getaffinity(0))), indent=1))
        return
    if args.replot:
        res = json.loads((args.out / "bench_build.json").read_text())
        plot(res, args.out / "bench_build.png")
        (args.out / "bench_build.md").write_text(report(res))
        return
    workers = args.jobs or len(os.sched_getaffinity(0))
    if args.sizes_only:
        _sizes_into(args, workers)
        return
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="kdbkit-bench-build-"))
    try:
        machine = machine_info()
        tp_targets = (args.throughput_targets.split(",") if args.throughput_targets
                      else list(QUICK_THROUGHPUT_TARGETS if args.quick else THROUGHPUT_TARGETS))
        res = {"date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "quick": args.quick, "machine": machine,
               "command": "python scripts/bench_build.py " + " ".join(sys.argv[1:])}
        notes: list[str] = []
        res["notes"] = notes
        log("the machine's own scaling (a plain CPU-bound task alone and in every CPU at once) ...")
        res["ceiling"] = machine_ceiling(workers)
        res["throughput"] = throughput(tp_targets, QUICK_THROUGHPUT_STRIDE if args.quick else 1, workers, work, notes)
        rb_targets = args.rebuild_targets.split(",") if args.rebuild_targets else rebuild_targets(args.quick, notes)
        res["rebuild"] = rebuild(rb_targets, workers, work, args.repeats or (2 if args.quick else 3))
        log("sizes ...")
        res["sizes"] = sizes(res["rebuild"].pop("bundle_paths"), workers, work)
        res["elapsed_s"] = time.perf_counter() - started
        machine["load_average_at_end"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_build.json").write_text(json.dumps(res, indent=2))
    (args.out / "bench_build.md").write_text(report(res))
    plot(res, args.out / "bench_build.png")
    log(f"done in {res['elapsed_s']:.0f} s: {args.out / 'bench_build.md'}")
    print((args.out / "bench_build.md").read_text())


def _sizes_into(args, workers: int) -> None:
    """``--sizes-only``: section 3 measured again, the rest of the report as it was."""
    path = args.out / "bench_build.json"
    res = json.loads(path.read_text())
    notes: list[str] = []
    targets = args.rebuild_targets.split(",") if args.rebuild_targets else rebuild_targets(args.quick, notes)
    work = Path(tempfile.mkdtemp(prefix="kdbkit-bench-sizes-"))
    try:
        measured = sizes_only(targets, workers, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = machine_info()
    measured["measured"] = {"command": "python scripts/bench_build.py " + " ".join(sys.argv[1:]),
                            "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "notes": notes,
                            "machine": f"{machine['cpu_model']}, {machine['usable_cpus']} CPUs"}
    res["sizes"] = measured
    path.write_text(json.dumps(res, indent=2))
    (args.out / "bench_build.md").write_text(report(res))
    plot(res, args.out / "bench_build.png")
    print((args.out / "bench_build.md").read_text())


if __name__ == "__main__":
    main()
