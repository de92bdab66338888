#!/usr/bin/env python3
"""A whole network's time to first result, in fresh processes: kdbkit with the installed
kernel package, kdbkit with an empty cache (JIT), and PyTorch eager's first call.

The networks are kdbkit's built-in ones (runtime/models): ResNet-50 forward (fp16, batch 32,
channels-last: convolutions, batch norms, activations, pooling, additions and the final
matrix multiply) and BERT-base's encoder (fp16, batch 32, 128 tokens, 12 layers).

Every child process opens the GPU (CUDA initialisation, not timed), builds the network's
parameters on the host and puts them on the GPU (not timed: ``model.to("cuda")`` in PyTorch),
then times, from its own start of work to the output read back on the host:

- ``bundle``: making a kdbkit handle (which opens the installed bundle) and the first forward;
  run with the installed kernel package in a virtual environment, ``KDB_DISABLE_JIT=1`` and
  an empty user cache and find-db, so every program comes from the package's bundle and every
  solver choice from its tuned find-db (the resolutions by source are recorded);
- ``jit``: the same with no package, an empty cache and find-db: every program is compiled;
- ``torch``: PyTorch eager's first forward of the same network and parameters (cuDNN and
  cuBLAS handles, heuristics and lazily loaded kernels included, as a user's first call pays).

Then :data:`LATER` more forwards are timed, each on its own (their median is a process's
later-forward time: the work itself, host and device, which a single forward shows with the
spread of one sample). The bundle processes also check
the output against PyTorch's for the same input.

Usage (on the GPU machine, after ``kdb tune`` and ``kdb package``, see scripts/run_gpu_checks.sh):
  python scripts/bench_network.py --packages WHEELS [--runs 5] [--jit-runs 2] [--out docs]
  python scripts/bench_network.py --write-catalogue FILE   # the problems to build and tune for
  python scripts/bench_network.py --replot [--out docs]
  python scripts/bench_network.py --smoke     # a check of the script on the CPU, in a temporary folder
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NETWORKS = {  # name -> (model, sizes)
    "resnet50": ("resnet50", dict(batch=32, dtype="fp16", layout="NHWC")),
    "bert_base": ("bert_base", dict(batch=32, dtype="fp16", layout="NCHW")),
}
SMALL = {"resnet50": dict(image=32, batch=2), "bert_base": dict(batch=2, seq=16, hidden=64, heads=4,
                                                                  intermediate=128, layers=2)}
TARGET_BUNDLE_MS, TARGET_VS_JIT, TARGET_VS_TORCH = 50.0, 50.0, 10.0
LATER = 10  # forwards timed after the first, one by one: a process's later-forward time is their median
KDB_CALL = "import sys; from kdbkit.runtime.cli.app import main; sys.exit(main())"


def _network(name: str):
    from kdbkit.runtime import models

    model, sizes = NETWORKS[name]
    if os.environ.get("BENCH_NETWORK_SMALL"):  # --small: the same code on tiny sizes, for a check without a GPU
        sizes = {**sizes, **SMALL[name], "dtype": "fp32"}
    return models.build(model, **sizes)


# -- child: one fresh process, one mode, one network --------------------------------------------

def child(mode: str, name: str) -> None:
    import numpy as np

    if mode == "profile":
        json.dump(profile_first(name), sys.stdout)
        return

    t_start = time.perf_counter()
    net = _network(name)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    record: dict = {"mode": mode, "network": name, "python": sys.executable}
    if mode == "torch":
        import torch

        t0 = time.perf_counter()
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        record["cuda_init_ms"] = (time.perf_counter() - t0) * 1e3
        forward, to_input = net.torch_callable("cuda")
        xt = to_input(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(1 + LATER):
            t0 = time.perf_counter()
            out = forward(xt).float().cpu().numpy()
            times.append((time.perf_counter() - t0) * 1e3)
        record.update(first_ms=times[0], second_ms=times[1], later_ms=statistics.median(times[1:]),
                      torch=torch.__version__,
                      device=torch.cuda.get_device_name())
    else:
        from kdbkit.runtime.backends.registry import default_device, open_backend
        from kdbkit.runtime.handle import Handle

        t0 = time.perf_counter()
        backend = open_backend(default_device())
        backend.synchronize()
        record["cuda_init_ms"] = (time.perf_counter() - t0) * 1e3
        from kdbkit.runtime import startup_memo

        # looked for by hand: asking kdbkit.runtime.paths would import platformdirs before the timing
        record["memo_written_before"] = any(Path(os.environ["XDG_CACHE_HOME"]).glob(f"kdbkit/*/{startup_memo.FILE_NAME}"))
        t0 = time.perf_counter()
        handle = Handle(backend=backend)  # opens the installed bundle: kdbkit's own start-up, timed
        record["handle_ms"] = (time.perf_counter() - t0) * 1e3
        record["handle_steps"] = [(s.name, round(s.ms, 3), s.outcome) for s in handle.prepare_steps]
        record["prefetch_listed"] = _prefetch_listed(handle)  # the last process's handle noted them
        t0 = time.perf_counter()  # the parameters on the device, as model.to("cuda") would: not timed
        net.to_device(handle)
        staged = net.input_tensor(handle, x)
        backend.synchronize()
        upload_ms = (time.perf_counter() - t0) * 1e3
        times, issued = [], []
        for _ in range(1 + LATER):
            t0 = time.perf_counter()
            result = net.forward(handle, staged)
            issued.append((time.perf_counter() - t0) * 1e3)  # the host's part: every launch issued
            out = net.download(handle, result)
            times.append((time.perf_counter() - t0) * 1e3)
        record.update(first_ms=record["handle_ms"] + times[0], forward_ms=times[0], second_ms=times[1],
                      later_ms=statistics.median(times[1:]), first_issue_ms=issued[0], second_issue_ms=issued[1],
                      later_issue_ms=statistics.median(issued[1:]),
                      upload_ms=upload_ms, resolved=handle.resolved_by_source, device=handle.device.name,
                      target=str(handle.target), find_db=_find_db_sources(handle, net),
                      solvers=_solvers_chosen(handle),
                      bundle=[(str(c.path), c.origin) for c in handle.system_trace if c.status == "accepted"])
        record["later_profile"] = _later_profile(net, handle, staged)
        if mode == "bundle":
            record["vs_torch"] = _compare_with_torch(net, x, out)
        handle.close()
    record["process_ms"] = (time.perf_counter() - t_start) * 1e3
    record["finite"] = bool(np.isfinite(out).all())
    json.dump(record, sys.stdout)


def _prefetch_listed(handle) -> int:
    """How many programs and problems the handle's prefetch worker was given, read from its
    "start prefetch" step ("N programs, M problems"); 0 where no worker started."""
    import re

    step = next((s for s in handle.prepare_steps if s.name == "start prefetch"), None)
    return sum(int(n) for n in re.findall(r"\d+", step.outcome)) if step is not None else 0


def _find_db_sources(handle, net) -> dict[str, int]:
    """Where immediate mode's choices came from, counted: a find-db file, or the heuristic."""
    counts: dict[str, int] = {}
    for problem in net.problems():
        records = handle.find_db.load(problem.config())
        where = "heuristic" if records is None else ("user" if records[1] == "user" else Path(records[1]).name)
        counts[where] = counts.get(where, 0) + 1
    return counts


def _later_profile(net, handle, staged) -> dict:
    """One more later forward under cProfile (after the timed ones): where its host time goes,
    the functions with the most time of their own, and how many calls took a primitive's full
    path instead of a repeat plan (each costs several times a plan's host time)."""
    stats = _profiled(lambda: net.forward(handle, staged))
    handle.backend.synchronize()

    def calls_of(file: str, function: str) -> int:
        return sum(v[0] for (f, _, name), v in stats.items() if name == function and f.endswith(file))

    # every primitive call goes through repeat's wrapper; only a full-path one makes its Operands
    return {"top": _top(stats, 2), "primitive_calls": calls_of("repeat.py", "call"),
            "full_path_calls": calls_of("operands.py", "__init__")}


def _profiled(work) -> dict:
    """pstats' table of ``work()`` run under cProfile: (file, line, name) -> (calls, primitive
    calls, own s, total s, callers)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    return pstats.Stats(profiler).stats


def _top(stats: dict, column: int, count: int = 15) -> list[dict]:
    """The ``count`` functions with the most time in pstats' ``column`` (2: their own, 3: with
    what they call)."""
    rows = sorted(stats.items(), key=lambda kv: kv[1][column], reverse=True)[:count]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": calls, "own_us": round(own * 1e6, 1),
             "total_us": round(total * 1e6, 1)} for (f, line, name), (calls, _, own, total, _) in rows]


def profile_first(name: str) -> dict:
    """A bundle process's handle and first forward under cProfile, the parameters' upload
    between them left out as the timed runs leave it (not timed with the others: the profiler
    slows Python several times): where the first result's time goes, by the functions' own
    time and by their time with what they call."""
    import cProfile
    import pstats

    import numpy as np

    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.runtime.handle import Handle

    net = _network(name)
    backend = open_backend(default_device())
    backend.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    handle = Handle(backend=backend)
    profiler.disable()
    net.to_device(handle)
    staged = net.input_tensor(handle, np.zeros(net.input_shape, np.float32))
    backend.synchronize()
    profiler.enable()
    net.download(handle, net.forward(handle, staged))
    profiler.disable()
    handle.close()
    stats = pstats.Stats(profiler).stats
    return {"network": name, "top_own": _top(stats, 2, 25), "top_total": _top(stats, 3, 40)}


def _solvers_chosen(handle) -> dict[str, int]:
    """The solvers the forward's problems were given (immediate mode's choices), counted by name."""
    counts: dict[str, int] = {}
    for choice in handle.dispatcher.choices.values():
        counts[choice.solver.name] = counts.get(choice.solver.name, 0) + 1
    return dict(sorted(counts.items()))


def _compare_with_torch(net, x, out) -> dict:
    import numpy as np

    try:
        want = net.torch_forward(x)
    except ImportError:
        return {"skipped": "PyTorch is not installed"}
    err = float(np.linalg.norm(out.astype(np.float64) - want) / np.linalg.norm(want))
    return {"rel_error": err, "ok": err < 5e-3}


# -- parent ---------------------------------------------------------------------------------------

def _run_child(python: str, mode: str, name: str, env: dict) -> dict:
    done = subprocess.run([python, __file__, "--child", mode, name], env=env, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def _clean_env(tmp: Path, cache: str | None = None, **extra: str) -> dict:
    # The per-user folders where a user who sets nothing has them (platformdirs, under XDG's
    # variables), not KDB_CUSTOM_CACHE_DIR and KDB_USER_DB_PATH: what finding them costs counts.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDB_", "XDG_"))}
    cache, db = cache or tempfile.mkdtemp(dir=tmp), tempfile.mkdtemp(dir=tmp)
    env.update(XDG_CACHE_HOME=cache, XDG_DATA_HOME=db, CUDA_CACHE_DISABLE="1",
               KDB_BACKEND=os.environ.get("BENCH_NETWORK_BACKEND", "cuda"), **extra)
    return env


def install_into_venv(packages: Path, venv: Path) -> tuple[str, dict]:
    """A virtual environment that sees this one's packages, with the kernel package installed by
    ``kdb install`` (its report returned)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True).stdout.strip()
    import sysconfig  # this environment's packages (kdbkit among them) seen from the new one, which installs into its own

    Path(site, "outer_env.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    done = subprocess.run([python, "-c", KDB_CALL, "install", "--from", str(packages), "--json"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if not k.startswith("KDB_")})
    if done.returncode != 0:
        raise SystemExit(f"kdb install failed:\n{done.stdout}\n{done.stderr}")
    return python, json.loads(done.stdout)


def build_packages(names: list[str], tmp: Path) -> Path:
    """The kernel package of the networks' problems for the default device, as a user makes it:
    ``kdb build`` from the problems' catalogue, then ``kdb package``. Returns the wheels' folder."""
    from kdbkit.runtime.backends.registry import default_device

    catalogue = tmp / "catalogue.txt"
    lines = [p.config() for name in names for p in _network(name).problems()]
    catalogue.write_text("".join(f"{line}\n" for line in dict.fromkeys(lines)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env["KDB_BACKEND"] = os.environ["BENCH_NETWORK_BACKEND"]
    target = str(default_device().target)
    steps = (lambda: ["build", "--target", target, "-c", str(catalogue), "-o", str(tmp / "bundles")],
             lambda: ["package", *map(str, sorted((tmp / "bundles").glob("*.kdb"))), "-o", str(tmp / "wheels")])
    for step in steps:
        args = step()
        done = subprocess.run([sys.executable, "-c", KDB_CALL, *args], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"kdb {args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return tmp / "wheels"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "NETWORK"), help=argparse.SUPPRESS)
    ap.add_argument("--packages", type=Path, help="folder of kernel wheels (kdb package's output)")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per mode (bundle, torch)")
    ap.add_argument("--jit-runs", type=int, default=2, help="fresh processes for the JIT mode")
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    ap.add_argument("--compare-prefetch", action="store_true", help="also run the bundle processes with "
                    "KDB_DISABLE_PREFETCH=1, interleaved (the same user cache folder)")
    ap.add_argument("--write-catalogue", type=Path, help="write the networks' problems to FILE and stop")
    ap.add_argument("--replot", action="store_true")
    ap.add_argument("--small", action="store_true", help="tiny sizes in fp32 on the default device, no PyTorch: "
                    "a check of the script on a machine without a GPU")
    ap.add_argument("--smoke", action="store_true", help="--small end to end in a temporary folder, one process per "
                    "mode: the networks' bundle built for the default device (kdb build), packaged (kdb package), "
                    "installed and timed; prints the figures, writes nothing under docs/")
    ap.add_argument("--profile-first", action="store_true", help="also one bundle process per network with its "
                    "handle and first forward under cProfile (the functions with the most time, in "
                    "bench_network.json's first_profiles; not among the timed runs)")
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return
    names = [n for n in args.networks.split(",") if n]
    if args.smoke:
        args.small, args.runs, args.jit_runs = True, 1, 1
    if args.small:
        os.environ.update(BENCH_NETWORK_SMALL="1", BENCH_NETWORK_BACKEND=os.environ.get("KDB_BACKEND", "opencl"))
    if args.write_catalogue:
        lines = [p.config() for name in names for p in _network(name).problems()]
        args.write_catalogue.write_text("".join(f"{line}\n" for line in dict.fromkeys(lines)))
        print(f"{args.write_catalogue}: {len(set(lines))} problems")
        return
    if args.replot:
        data = json.loads((args.out / "bench_network.json").read_text())
        report(data, args.out)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-network-"))
    if args.smoke and not args.packages:
        args.packages = build_packages(names, tmp)
    if not args.packages:
        ap.error("--packages is required")
    python, installed = install_into_venv(args.packages, tmp / "venv")
    results: dict = {"installed": installed, "networks": {}}
    for name in names:
        runs: dict[str, list] = {"bundle": [], "jit": [], "torch": []}
        # The bundle runs share one user cache folder, as one user's processes do: the first
        # writes the startup memo (runtime/startup_memo.py), the later ones read it. Its kernel
        # cache stays empty (no JIT, and system hits are not copied there): the resolutions
        # by source show every program coming from the bundle.
        user_cache = tempfile.mkdtemp(dir=tmp)
        for _ in range(args.runs):  # interleaved, so drift touches every mode alike
            runs["bundle"].append(_run_child(python, "bundle", name,
                                             _clean_env(tmp, user_cache, KDB_DISABLE_JIT="1")))
            if args.compare_prefetch:
                runs.setdefault("bundle_no_prefetch", []).append(_run_child(
                    python, "bundle", name, _clean_env(tmp, user_cache, KDB_DISABLE_JIT="1", KDB_DISABLE_PREFETCH="1")))
            if not args.small:
                runs["torch"].append(_run_child(sys.executable, "torch", name, _clean_env(tmp)))
        for _ in range(args.jit_runs):
            runs["jit"].append(_run_child(sys.executable, "jit", name, _clean_env(tmp)))
        results["networks"][name] = runs
        if args.profile_first:
            results.setdefault("first_profiles", {})[name] = _run_child(
                python, "profile", name, _clean_env(tmp, user_cache, KDB_DISABLE_JIT="1"))
        print(name, {m: [round(r["first_ms"], 1) for r in rs] for m, rs in runs.items()}, flush=True)
    if args.small:
        print(json.dumps(results, indent=1)[:3000])
        for name, profile in results.get("first_profiles", {}).items():
            print(name, "first result profiled, most own time:", ", ".join(r["function"] for r in profile["top_own"][:3]))
        wrong = [f"{name}: {r['resolved']}, finite {r['finite']}" for name, runs in results["networks"].items()
                 for r in runs["bundle"] if not set(r["resolved"]) <= {"system"} or not r["finite"]]
        if wrong:
            raise SystemExit("the installed bundle did not serve every program, or a result is not finite: "
                             + "; ".join(wrong))
        return
    results["machine"] = {"platform": platform.platform(), "python": sys.version.split()[0],
                          "device": results["networks"][names[0]]["bundle"][0]["device"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_network.json").write_text(json.dumps(results, indent=1))
    report(results, args.out)


def report(data: dict, out: Path) -> None:
    lines = ["# A whole network's time to first result", "",
             "`python scripts/bench_network.py --packages WHEELS` (see its docstring; fresh processes, medians).",
             *([f"Made by {data['made']}."] if data.get("made") else []),
             f"Device: {data['machine']['device']}.", "",
             "| network | kdbkit, installed bundle | kdbkit, empty cache (JIT) | PyTorch eager, first call | "
             f"JIT / bundle | PyTorch / bundle | later forward, median of {LATER} (kdbkit / PyTorch) | "
             "resolutions (bundle) |",
             "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for name, runs in data["networks"].items():
        med = {m: statistics.median(r["first_ms"] for r in rs) for m, rs in runs.items() if rs}
        # runs from before later_ms was recorded give their one second forward
        second = {m: statistics.median(r.get("later_ms", r["second_ms"]) for r in rs) for m, rs in runs.items() if rs}
        resolved = runs["bundle"][0]["resolved"]
        lines.append(f"| {name} | {med['bundle']:.1f} ms | {med['jit'] / 1e3:.1f} s | {med['torch']:.0f} ms | "
                     f"{med['jit'] / med['bundle']:.0f}x | {med['torch'] / med['bundle']:.1f}x | "
                     f"{second['bundle']:.1f} / {second['torch']:.1f} ms | {resolved} |")
        checks = runs["bundle"][0].get("vs_torch", {})
        verdicts += [
            f"- {name}: bundle {med['bundle']:.1f} ms <= {TARGET_BUNDLE_MS:.0f} ms: "
            f"{'PASS' if med['bundle'] <= TARGET_BUNDLE_MS else 'FAIL'}",
            f"- {name}: JIT / bundle {med['jit'] / med['bundle']:.0f}x >= {TARGET_VS_JIT:.0f}x: "
            f"{'PASS' if med['jit'] / med['bundle'] >= TARGET_VS_JIT else 'FAIL'}",
            f"- {name}: PyTorch / bundle {med['torch'] / med['bundle']:.1f}x >= {TARGET_VS_TORCH:.0f}x: "
            f"{'PASS' if med['torch'] / med['bundle'] >= TARGET_VS_TORCH else 'FAIL'}",
            f"- {name}: later forward, PyTorch / kdbkit {second['torch'] / second['bundle']:.2f}x >= 1.0x: "
            f"{'PASS' if second['torch'] >= second['bundle'] else 'FAIL'}",
            f"- {name}: zero JIT with the bundle: {'PASS' if set(resolved) <= {'system'} else 'FAIL'} ({resolved}); "
            f"choices from {runs['bundle'][0]['find_db']}; against PyTorch: {checks}",
        ]
    cold, prefetch = [], []
    for name, runs in data["networks"].items():
        if runs.get("bundle_no_prefetch"):
            warm = [r["first_ms"] for r in runs["bundle"] if r.get("memo_written_before")]
            off = [r["first_ms"] for r in runs["bundle_no_prefetch"]]
            torch_ms = statistics.median(r["first_ms"] for r in runs["torch"]) if runs.get("torch") else None
            against = f"; PyTorch / bundle without prefetch {torch_ms / statistics.median(off):.1f}x" if torch_ms else ""
            prefetch.append(f"{name} {statistics.median(warm):.1f} ms with, {statistics.median(off):.1f} ms without "
                            f"(medians of {len(warm)} and {len(off)} processes after the first{against})")
        first = [r for r in runs["bundle"] if r.get("memo_written_before") is False]
        if first:
            cold.append(f"{name} {first[0]['first_ms']:.1f} ms (handle {first[0]['handle_ms']:.1f} ms)")
    lines += ["", "Targets:", *verdicts, "",
              "Each time starts after CUDA initialisation and with the parameters on the GPU; kdbkit's includes "
              "making its handle (opening the installed bundle). Per-run figures are in bench_network.json.",
              "The bundle processes share one user cache folder, as one user's processes do; its kernel cache stays "
              "empty (the resolutions above), and the first process writes the startup memo that the later ones read"
              + (f" (that first process: {'; '.join(cold)})." if cold else "."), ""]
    if prefetch:
        lines[-1:-1] = ["The programs the last process used loaded, and the problems it ran set up, by a background "
                        "thread from the handle's creation on (runtime/prefetch.py), against KDB_DISABLE_PREFETCH=1 in processes interleaved with them: "
                        + "; ".join(prefetch) + "."]
    (out / "bench_network.md").write_text("\n".join(lines))
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(data["networks"])
    modes = [("bundle", "kdbkit, installed bundle"), ("torch", "PyTorch eager, first call"), ("jit", "kdbkit, JIT")]
    for i, (mode, label) in enumerate(modes):
        vals = [statistics.median(r["first_ms"] for r in data["networks"][n][mode]) for n in names]
        ax.bar([j + i * 0.27 for j in range(len(names))], vals, width=0.27, label=label)
    ax.set_yscale("log")
    ax.set_xticks([j + 0.27 for j in range(len(names))], names)
    ax.set_ylabel("time to first result (ms, log)")
    ax.axhline(TARGET_BUNDLE_MS, color="gray", ls="--", lw=0.8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench_network.png", dpi=120)


if __name__ == "__main__":
    main()
