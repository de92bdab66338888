#!/usr/bin/env python3
"""Convolution layers of real networks timed against PyTorch (cuDNN) in one run, on a CUDA GPU.

Every layer of ResNet-50, MobileNet-V2 and ResNeXt-50 (32x4d) at batch 32 (``--models``), or a
set of distinct problems from real networks (``--set problems``), each direction, next to
PyTorch (cuDNN, benchmark mode: its best algorithm): the solver immediate mode chose (or, with
--find, the one find ranked first), each one's time and TFLOP/s, and per model, direction, type
and layout the sum of the layers' times weighted by how often each occurs.
Both libraries run on the same PyTorch tensors (NCHW and channels-last), timed like
bench_primitives (CUDA events around back-to-back calls, blocks alternating; ``--graph N``:
replays of a CUDA graph of N calls, so that layers shorter than a call's host time time the
GPU, not the host). Writes ``<out>/bench_conv.json``, ``.md`` and ``.png``
(``bench_conv_find.*`` with --find; ``_graph`` before the suffix with --graph).

``--set problems`` runs the benchmark set of scripts/conv_problems.py instead (over 300
problems of fifteen networks, batches 1 to 256, each problem's memory capped; forward only
unless --directions says more) and writes ``bench_conv_set*``: per type, layout and direction
the summed ratio, the lowest problem's ratio and how many fall below 0.3x and 0.8x.
``--compare-find`` times, for each problem, immediate mode's choice (made before find, with a
find-db of its own) against find's best, side by side, and writes ``bench_conv_compare*`` (or
``bench_conv_set_compare*``): immediate / find per problem, summed, and the worst rows.

    python scripts/bench_conv.py --out docs            # on the GPU machine
    python scripts/bench_conv.py --set problems --graph 10 --types fp16 --out docs
    python scripts/bench_conv.py --set problems --compare-find --layers 40 --types fp16 --out /tmp/bc
    python scripts/bench_conv.py --out /tmp/bc --layers 2 --types fp32 --directions F --iters 1 --blocks 1  # a check
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_primitives import git_commit, graphed, timed, timed_pair
from conv_problems import BATCH, MODELS, SET_BATCHES, SET_ELEMENTS_CAP, SET_NETWORKS, problem_set, spread
from conv_report import write_compare_report, write_report

TYPES = ("fp16", "fp32", "bf16")
LAYOUTS = ("NCHW", "NHWC")
DIRECTIONS = {"F": "forward", "B": "backward data", "W": "backward weights"}


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line (and status 2), not the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _count(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value
    return parse


def _directions(text: str) -> str:
    """F, B and W in any order, with or without commas ("FBW", "W,F")."""
    letters = "".join(text.replace(",", " ").split()).upper()
    if not letters or any(c not in DIRECTIONS for c in letters) or len(set(letters)) != len(letters):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give each of F (forward), B (backward data), W (backward weights) at most once, "
            "e.g. FBW, F or W,F")
    return letters


def _names(allowed):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"{text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
                                             f"give a comma-separated list of {', '.join(allowed)}")
        return names
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--iters", type=_count(1), default=5)
    parser.add_argument("--blocks", type=_count(1), default=3)
    parser.add_argument("--set", choices=("models", "problems"), default="models",
                        help="models: every layer of --models at batch 32 (bench_conv.*); problems: the benchmark "
                             "set of scripts/conv_problems.py (bench_conv_set.*)")
    parser.add_argument("--directions", type=_directions, default=None,
                        help="F, B, W (forward, backward data, backward weights), e.g. FBW or W,F "
                             "(default: FBW; F with --set problems)")
    parser.add_argument("--types", type=_names(TYPES), default=["fp16", "fp32"],
                        help=f"comma-separated, of {', '.join(TYPES)} (default: fp16,fp32)")
    parser.add_argument("--layouts", type=_names(LAYOUTS), default=list(LAYOUTS),
                        help="comma-separated, of NCHW, NHWC (default: both; a set split over two calls)")
    parser.add_argument("--models", type=_names(tuple(MODELS)), default=None,
                        help=f"comma-separated, of {', '.join(MODELS)} (--set models; default: all three)")
    parser.add_argument("--layers", type=_count(1), default=None,
                        help="only each model's first N layers, or N problems spread over the set (a check of the "
                             "script; the report says so)")
    parser.add_argument("--only", default="", help="only the layers whose '<model or network> <layer>' contains "
                                                   "one of these comma-separated texts")
    parser.add_argument("--graph", type=_count(0), default=0, metavar="N",
                        help="time replays of a CUDA graph of N calls (0: back-to-back eager calls)")
    parser.add_argument("--commit", default="", help="the commit measured (default: git rev-parse HEAD, if any)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                        help="no measuring: the reports of these runs' JSON files (stopped runs' too) together, "
                             "written into --out (a set split over several calls with --only)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--find", action="store_true",
                      help="run find for each layer first (as cuDNN's benchmark mode searches), writing "
                           "bench_conv_find.*; default: immediate mode's choice, bench_conv.*")
    mode.add_argument("--compare-find", action="store_true",
                      help="time immediate mode's choice (made before find, with a find-db of this run's own) "
                           "against find's best for each layer, writing bench_conv_compare.*")
    args = parser.parse_args(argv)
    if args.set == "problems" and args.models is not None:
        parser.error("argument --models: --set problems runs its own problems; --models picks the layers of "
                     "--set models")
    args.models = args.models or list(MODELS)
    args.directions = args.directions or ("F" if args.set == "problems" else "FBW")
    return args


def selected(args) -> list[tuple[str, list]]:
    """(model, its layers) to run: each of --models, or ("set", the set's problems)."""
    if args.set == "problems":
        chosen = [("set", spread(problem_set(), args.layers))]
    else:
        chosen = [(model, MODELS[model]()[:args.layers]) for model in args.models]
    return [(model, [c for c in layers if picked(args.only, f"{model} {c.name}")]) for model, layers in chosen]


def picked(only: str, name: str) -> bool:
    """Whether ``name`` ('<model> <layer>') contains one of --only's comma-separated texts (any
    name, where --only is empty)."""
    texts = [text for text in only.split(",") if text]
    return not texts or any(text in name for text in texts)


def stem_for(chosen_set: str, mode: str, graph: int) -> str:
    """The report files' name: bench_conv[_set][_find|_compare][_graph]."""
    return ("bench_conv_set" if chosen_set == "problems" else "bench_conv") + \
        {"find": "_find", "compare-find": "_compare"}.get(mode, "") + ("_graph" if graph else "")


def mode_of(args) -> str:
    return "find" if args.find else "compare-find" if args.compare_find else "immediate"


def stem_of(args) -> str:
    return stem_for(args.set, mode_of(args), args.graph)


def _bad(message: str) -> int:
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    return 2


def merge(paths: list[str], out: Path) -> int:
    """One report of several runs of the same mode and set: their rows together, the summary
    made again, the first run's settings (the commits, devices and subsets of all listed)."""
    runs = []
    for path in paths:
        try:
            run = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            return _bad(f"--merge: cannot read {path} ({e})")
        if not isinstance(run, dict) or not isinstance(run.get("rows"), list) or "mode" not in run:
            return _bad(f"--merge: {path} is not a JSON file bench_conv.py wrote")
        runs.append(run)
        kinds = {(r.get("mode"), r.get("set"), r.get("graph_calls")) for r in runs}
        if len(kinds) > 1:
            return _bad(f"--merge: {path} is another kind of run (mode, set, graph calls: {sorted(kinds, key=str)})")
    result = dict(runs[0])
    result["rows"] = [row for run in runs for row in run["rows"]]
    for key in ("device", "commit"):
        result[key] = ", ".join(dict.fromkeys(str(run.get(key, "")) for run in runs))
    result["merged"] = [{"file": str(path), "commit": run.get("commit"), "layers": run.get("layers"),
                         "only": run.get("only"), "rows": len(run["rows"]), "stopped": bool(run.get("partial"))}
                        for path, run in zip(paths, runs)]
    result.update(layers=None, only="")
    result.pop("partial", None)
    result["summary"] = summarise(result["rows"], result["mode"] == "compare-find")
    result["failed"] = sum("error" in r for r in result["rows"])
    stem = stem_for(result.get("set"), result["mode"], result.get("graph_calls"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (write_compare_report if result["mode"] == "compare-find" else write_report)(result, out, stem)
    print(f"{len(result['rows'])} rows of {len(runs)} runs: {out / stem}.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    args.commit = args.commit or git_commit()
    if args.compare_find:
        # Immediate mode must not read a ranking find made (in this run or an earlier one):
        # this process's user find-db is a fresh folder (installed bundles' find-dbs still count).
        os.environ["KDB_USER_DB_PATH"] = tempfile.mkdtemp(prefix="bench_conv_find_db_")
    try:
        import torch
    except ImportError:
        sys.exit("PyTorch is not installed: this benchmark times kdbkit next to PyTorch on the GPU machine")
    import kdbkit

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # fp32 against fp32, not TF32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem, rows = stem_of(args), []
    with kdbkit.Handle() as h:
        if h.device.backend != "cuda":
            sys.exit(f"kdbkit's default device is {h.device.name} ({h.device.backend}), not a CUDA GPU")
        for model, layers in selected(args):
            for label in args.types:
                for layout in args.layouts:
                    for layer in layers:
                        rows += measure_layer(h, torch, kdbkit, args, model, label, layout, layer)
                        # the rows so far, kept should the run be stopped (a time limit)
                        (out / f"{stem}.json").write_text(json.dumps(result_of(args, torch, kdbkit, rows, True)))
    result = result_of(args, torch, kdbkit, rows, False)
    for key, s in result["summary"].items():
        print(summary_line(key, s))
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (write_compare_report if args.compare_find else write_report)(result, out, stem)
    failed = [r for r in rows if "error" in r]
    if failed:
        print(f"{len(failed)} of {len(rows)} measurements failed (their rows say why)", file=sys.stderr)
        return 1
    return 0


def summary_line(key: str, s: dict) -> str:
    if "kdbkit_ms" in s:
        return (f"sum {key}: kdbkit {s['kdbkit_ms']:.2f} ms, torch {s['torch_ms']:.2f} ms, x{s['speedup_vs_torch']:.3f}"
                f" (lowest x{s['min_speedup']:.2f}: {s['min_layer']}; {s['below_0_3']} below 0.3x, {s['below_0_8']} "
                f"below 0.8x, {s['failed']} failed, of {s['problems']})")
    if "immediate_ms" in s:
        return (f"sum {key}: immediate {s['immediate_ms']:.2f} ms, find {s['find_ms']:.2f} ms, immediate/find "
                f"x{s['immediate_over_find']:.3f} (worst x{s['worst_immediate_over_find']:.2f}: {s['worst_layer']}; "
                f"{s['above_1_1']} above 1.10, {s['failed']} failed, of {s['problems']})")
    return f"sum {key}: all {s['problems']} failed"


def result_of(args, torch, kdbkit, rows: list[dict], partial: bool) -> dict:
    """The run's JSON: its settings, the summary and every row (``partial``: the run is not over)."""
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH if args.set == "models" else "per problem",
              "iters": args.iters, "blocks": args.blocks, "mode": mode_of(args), "set": args.set,
              "layers": args.layers, "layouts": args.layouts, "only": args.only, "graph_calls": args.graph,
              "commit": args.commit,
              "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "kdbkit": kdbkit.__version__,
              "summary": summarise(rows, args.compare_find), "failed": sum("error" in r for r in rows), "rows": rows}
    if partial:
        result["partial"] = True
    if args.set == "problems":
        result.update(networks=list(SET_NETWORKS), batches=sorted(SET_BATCHES), elements_cap=SET_ELEMENTS_CAP)
    return result


def operands(torch, layer, dt, fmt, directions: str) -> dict:
    """x, w and y (y by PyTorch's convolution, which runs cuDNN's search for it), and the
    gradients the backward directions asked for need."""
    x = torch.randn(layer.n, layer.c, layer.h, layer.w, device="cuda", dtype=dt).to(memory_format=fmt)
    fan_in = layer.c // layer.groups * layer.filter[0] * layer.filter[1]
    w = (torch.randn(layer.k, layer.c // layer.groups, *layer.filter, device="cuda", dtype=dt) / fan_in ** 0.5
         ).to(memory_format=fmt)
    t = {"x": x, "w": w, "y": torch.nn.functional.conv2d(x, w, None, layer.stride, layer.pad, layer.dilation,
                                                         layer.groups)}
    if set(directions) & {"B", "W"}:
        t["dy"] = torch.randn_like(t["y"])
    if "B" in directions:
        t["dx"] = torch.empty_like(x)
    if "W" in directions:
        t["dw"] = torch.empty_like(w)
    return t


def calls(h, torch, kdbkit, layer, t: dict, direction: str, solver=None):
    """kdbkit's call (with ``solver``, that solver's) and PyTorch's, for ``direction``."""
    F, grad = torch.nn.functional, torch.nn.grad
    geometry = {"pad": layer.pad, "stride": layer.stride, "dilation": layer.dilation, "groups": layer.groups}
    torch_geometry = (layer.stride, layer.pad, layer.dilation, layer.groups)
    if direction == "F":
        return (lambda: kdbkit.convolution_forward(h, t["x"], t["w"], y=t["y"], solver=solver, **geometry),
                lambda: F.conv2d(t["x"], t["w"], None, *torch_geometry))
    if direction == "B":
        return (lambda: kdbkit.convolution_backward_data(h, t["dy"], t["w"], t["x"].shape, dx=t["dx"], solver=solver,
                                                         **geometry),
                lambda: grad.conv2d_input(t["x"].shape, t["w"], t["dy"], *torch_geometry))
    return (lambda: kdbkit.convolution_backward_weights(h, t["dy"], t["x"], t["w"].shape, dw=t["dw"], solver=solver,
                                                        **geometry),
            lambda: grad.conv2d_weight(t["x"], t["w"].shape, t["dy"], *torch_geometry))


def time_pair(h, torch, args, name: str, first, second) -> tuple[float, float, bool]:
    """Each call's time (ms per call), timed as the options say, and whether a CUDA graph was
    wanted but the calls ran eagerly (one could not be captured: said on a line of its own).
    ``second`` None: ``first`` alone, its time given twice."""
    repeats, eager = 1, False
    if args.graph:
        for call in (first, second):
            if call is not None:
                call()  # resolved (compiled, maps encoded; cuDNN's search) before the capture
        torch.cuda.synchronize()
        try:
            first, second = (None if c is None else graphed(c, args.graph, h) for c in (first, second))
            repeats = args.graph
        except Exception as e:  # a call that cannot be captured: timed eagerly, and said so
            print(f"{name}: no CUDA graph ({type(e).__name__}: {e}); timing eager calls", flush=True)
            eager = True
    if second is None:
        t = timed(first, iters=args.iters, blocks=args.blocks)
        return t / repeats, t / repeats, eager
    t_first, t_second, _ = timed_pair(first, second, iters=args.iters, blocks=args.blocks)
    return t_first / repeats, t_second / repeats, eager


def measure_layer(h, torch, kdbkit, args, model: str, label: str, layout: str, layer) -> list[dict]:
    """One row per direction for ``layer`` in type ``label`` and ``layout``; a direction that
    fails gives a row with the error (one line printed), and the others still run."""
    from kdbkit.runtime.find import find_solutions
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.tensor import DataType

    types = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    net, name = layer.name.split(" ", 1) if model == "set" else (model, layer.name)
    rows = []
    try:
        t = operands(torch, layer, types[label], fmt, args.directions)
    except Exception as e:  # PyTorch's own failure (memory): every direction's row says so
        t, failure = None, f"{type(e).__name__}: {e}".splitlines()[0]
    for direction in args.directions:
        problem = layer.problem(direction, DataType.parse(label), layout)
        row = {"model": model, "net": net, "type": label, "layout": layout, "direction": direction, "layer": name,
               "count": layer.count, "batch": layer.n, "key": problem.config()}
        title = f"{model} {label} {layout} {direction} {layer.name}"
        try:
            if t is None:
                raise RuntimeError(failure)
            if args.compare_find:
                row.update(compare(h, torch, kdbkit, args, title, layer, t, direction, problem, choose, find_solutions))
            else:
                if args.find:
                    find_solutions(h, problem)  # recorded: choose takes the find-db's best
                solver = choose(h, problem).solver.name
                ours, theirs = calls(h, torch, kdbkit, layer, t, direction)
                t_ours, t_torch, eager = time_pair(h, torch, args, title, ours, theirs)
                row.update(solver=solver, kdbkit_ms=t_ours, torch_ms=t_torch, speedup_vs_torch=t_torch / t_ours,
                           kdbkit_tflops=problem.flops / t_ours / 1e9, torch_tflops=problem.flops / t_torch / 1e9,
                           **({"eager": True} if eager else {}))
                print(f"{title:60s} {solver:15s} kdbkit {t_ours:8.3f} ms torch {t_torch:8.3f} ms "
                      f"x{t_torch / t_ours:5.2f} ({row['kdbkit_tflops']:6.1f} vs {row['torch_tflops']:6.1f} TFLOP/s)",
                      flush=True)
        except Exception as e:  # one failing problem must not end a long run: its row says why
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            print(f"{title}: failed ({row['error']})", flush=True)
        rows.append(row)
    return rows


def compare(h, torch, kdbkit, args, title: str, layer, t: dict, direction: str, problem, choose,
            find_solutions) -> dict:
    """Immediate mode's choice (made before find) and find's best, each timed the same way."""
    choice = choose(h, problem)
    found = find_solutions(h, problem)
    immediate, best = choice.solver.name, found[0].solver
    first = calls(h, torch, kdbkit, layer, t, direction, solver=immediate)[0]
    second = None if best == immediate else calls(h, torch, kdbkit, layer, t, direction, solver=best)[0]
    t_imm, t_find, eager = time_pair(h, torch, args, title, first, second)
    ratio = t_imm / t_find
    print(f"{title:60s} immediate {immediate:15s} {t_imm:8.3f} ms find {best:15s} {t_find:8.3f} ms "
          f"immediate/find x{ratio:5.2f}", flush=True)
    return {"immediate_solver": immediate, "how": choice.how, "find_solver": best, "immediate_ms": t_imm,
            "find_ms": t_find, "immediate_over_find": ratio, "find_ranked": len(found),
            "find_own_ms": found[0].time_ms, **({"eager": True} if eager else {})}


def full_name(row: dict) -> str:
    """A row's layer, after its network's name in the set."""
    return f"{row['net']} {row['layer']}" if row["model"] == "set" else row["layer"]


def summarise(rows: list[dict], compared: bool) -> dict:
    """Per model (or the set), type, layout and direction: the times summed (each layer weighted
    by its count), their ratio, the lowest per-problem ratio and how many fall past the marks."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['model']} {r['type']} {r['layout']} {r['direction']}", []).append(r)
    summary = {}
    for key, found in groups.items():
        ok = [r for r in found if "error" not in r]
        if not ok:
            summary[key] = {"problems": len(found), "failed": len(found)}
            continue
        if compared:
            imm = sum(r["immediate_ms"] * r["count"] for r in ok)
            fnd = sum(r["find_ms"] * r["count"] for r in ok)
            worst = max(ok, key=lambda r: r["immediate_over_find"])
            summary[key] = {"immediate_ms": imm, "find_ms": fnd, "immediate_over_find": imm / fnd,
                            "worst_immediate_over_find": worst["immediate_over_find"], "worst_layer": full_name(worst),
                            "above_1_1": sum(r["immediate_over_find"] > 1.1 for r in ok),
                            "other_solver": sum(r["immediate_solver"] != r["find_solver"] for r in ok),
                            "problems": len(found), "failed": len(found) - len(ok)}
        else:
            ours = sum(r["kdbkit_ms"] * r["count"] for r in ok)
            theirs = sum(r["torch_ms"] * r["count"] for r in ok)
            worst = min(ok, key=lambda r: r["speedup_vs_torch"])
            summary[key] = {"kdbkit_ms": ours, "torch_ms": theirs, "speedup_vs_torch": theirs / ours,
                            "min_speedup": worst["speedup_vs_torch"], "min_layer": full_name(worst),
                            "below_0_3": sum(r["speedup_vs_torch"] < 0.3 for r in ok),
                            "below_0_8": sum(r["speedup_vs_torch"] < 0.8 for r in ok),
                            "problems": len(found), "failed": len(found) - len(ok)}
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
