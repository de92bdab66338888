"""The Markdown reports and plots of scripts/bench_conv.py: the models' (the format docs/bench_conv.md
has always had), the problem set's (each group's lowest ratio and how many problems fall below
0.3x and 0.8x, the worst problems) and --compare-find's (immediate mode's choice against find's best)."""

from __future__ import annotations

import sys
from pathlib import Path

WORST_ROWS = 20  # the worst problems listed before the full table


def _timing(result: dict) -> str:
    return (f"median of {result['blocks']} blocks of {result['iters']} "
            + (f"replays of a CUDA graph of {result['graph_calls']} calls" if result.get("graph_calls") else "calls")
            + ", the blocks alternating")


def _subset(result: dict) -> str:
    text = ""
    if result.get("layers"):
        text += (f" **Only {result['layers']} problems spread over the set.**" if result.get("set") == "problems"
                 else f" **Only each model's first {result['layers']} layers.**")
    if result.get("only"):
        text += f" **Only the layers whose name contains '{result['only']}'.**"
    if result.get("merged"):
        text += " Rows of " + str(len(result["merged"])) + " runs: " + "; ".join(
            f"{m['file']} ({m['rows']} rows, commit {m['commit']}"
            + (f", --layers {m['layers']}" if m.get("layers") else "")
            + (f", only '{m['only']}'" if m.get("only") else "")
            + (", **stopped before its end**" if m.get("stopped") else "") + ")" for m in result["merged"]) + "."
    if result.get("failed"):
        text += f" **{result['failed']} measurements failed: their rows say why.**"
    return text


def _set_intro(result: dict) -> str:
    if result.get("set") != "problems":
        return ""
    cap = result["elements_cap"]
    return (f"The set: distinct problems from {len(result['networks'])} networks ({', '.join(result['networks'])}; "
            "scripts/conv_problems.py), each at a batch from "
            f"{', '.join(map(str, result['batches']))}, halved until x and y together hold at most "
            f"{cap:,} elements ({cap * 4 / 2 ** 30:.0f} GiB in fp32), so that every direction's tensors stay "
            "far inside an 80 GB card. Each problem counts once in the sums.")


def _name(r: dict) -> str:
    return f"{r['net']} {r['layer']}" if r.get("model") == "set" else r["layer"]


def write_report(result: dict, out: Path, stem: str) -> None:
    """``<stem>.md`` and ``.png`` of a run against PyTorch."""
    is_set = result.get("set") == "problems"
    flags = (" --set problems" if is_set else "") + (" --find" if result["mode"] == "find" else "") + \
        (f" --graph {result['graph_calls']}" if result.get("graph_calls") else "")
    lines = [f"# Convolution against PyTorch (cuDNN) on {result['device']}", "",
             (f"Written by `python scripts/bench_conv.py{flags if is_set else ''}`"
              + (f" at commit {result['commit']}" if result.get("commit") else "")
              + (f" (batch {result['batch']}; " if not is_set else " (")
              + f"cuDNN {result['cudnn']} in benchmark mode, TF32 off; kdbkit's solver from {result['mode']} mode; "
              + _timing(result).replace("the blocks", "the libraries' blocks") + "). "
              + ("Sums weight each layer by how often the model runs it." if not is_set else _set_intro(result))
              + _subset(result)), ""]
    if is_set:
        lines += ["| set, type, layout, direction | problems | kdbkit ms | torch ms | torch / kdbkit (summed) | lowest "
                  "| lowest problem | below 0.3x | below 0.8x | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
        for key, s in result["summary"].items():
            if "kdbkit_ms" not in s:
                lines.append(f"| {key} | {s['problems']} | | | | | | | | {s['failed']} |")
                continue
            lines.append(f"| {key} | {s['problems']} | {s['kdbkit_ms']:.2f} | {s['torch_ms']:.2f} | "
                         f"{s['speedup_vs_torch']:.3f} | {s['min_speedup']:.2f} | {s['min_layer']} | "
                         f"{s['below_0_3']} | {s['below_0_8']} | {s['failed']} |")
        timed = [r for r in result["rows"] if "speedup_vs_torch" in r]
        worst = sorted(timed, key=lambda r: r["speedup_vs_torch"])[:WORST_ROWS]
        head = ["| network | layer | N | type | layout | dir | solver | kdbkit ms | torch ms | torch / kdbkit | "
                "kdbkit TFLOP/s | torch TFLOP/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += ["", f"The {len(worst)} lowest ratios:", "", *head, *(_set_row(r) for r in worst),
                  "", "Every problem:", "", *head, *(_set_row(r) for r in result["rows"])]
    else:
        lines += ["| model, type, layout, direction | kdbkit ms | torch ms | torch / kdbkit |", "|---|---|---|---|"]
        for key, s in result["summary"].items():
            if "kdbkit_ms" in s:
                lines.append(f"| {key} | {s['kdbkit_ms']:.2f} | {s['torch_ms']:.2f} | {s['speedup_vs_torch']:.3f} |")
            else:
                lines.append(f"| {key} | failed | | |")
        lines += ["", "| model | type | layout | dir | layer | x | solver | kdbkit ms | torch ms | torch / kdbkit | "
                  "kdbkit TFLOP/s | torch TFLOP/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in result["rows"]:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['type']} | {r['layout']} | {r['direction']} | {r['layer']} | "
                             f"{r['count']} | failed: {r['error']} | | | | | |")
                continue
            lines.append(f"| {r['model']} | {r['type']} | {r['layout']} | {r['direction']} | {r['layer']} | "
                         f"{r['count']} | {r['solver']} | {r['kdbkit_ms']:.3f} | {r['torch_ms']:.3f} | "
                         f"{r['speedup_vs_torch']:.2f} | {r['kdbkit_tflops']:.1f} | {r['torch_tflops']:.1f} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    _plot(result, out, stem, "speedup_vs_torch", 0.8 if is_set else 0.5,
          "cuDNN time / kdbkit time, summed" + (" over the set" if is_set else " over the model's layers")
          + " (> 1: kdbkit faster)",
          f"kdbkit convolution ({result['mode']} mode) vs cuDNN, "
          + ("the problem set" if is_set else f"batch {result['batch']}") + f", {result['device']}")


def _set_row(r: dict) -> str:
    if "error" in r:
        return (f"| {r['net']} | {r['layer']} | {r['batch']} | {r['type']} | {r['layout']} | {r['direction']} | "
                f"failed: {r['error']} | | | | | |")
    return (f"| {r['net']} | {r['layer']} | {r['batch']} | {r['type']} | {r['layout']} | {r['direction']} | "
            f"{r['solver']} | {r['kdbkit_ms']:.4f} | {r['torch_ms']:.4f} | {r['speedup_vs_torch']:.2f} | "
            f"{r['kdbkit_tflops']:.1f} | {r['torch_tflops']:.1f} |")


def write_compare_report(result: dict, out: Path, stem: str) -> None:
    """``<stem>.md`` and ``.png`` of --compare-find: immediate mode's time over find's best."""
    is_set = result.get("set") == "problems"
    flags = (" --set problems" if is_set else "") + " --compare-find" + \
        (f" --graph {result['graph_calls']}" if result.get("graph_calls") else "")
    lines = [f"# Convolution: immediate mode's choice against find's best on {result['device']}", "",
             (f"Written by `python scripts/bench_conv.py{flags}`"
              + (f" at commit {result['commit']}" if result.get("commit") else "")
              + " (for each problem, in one process: immediate mode's choice, made before find ran and with a "
              "user find-db of this run's own (installed bundles' find-dbs still read), then find's ranking; the two "
              "solvers timed the same way, " + _timing(result) + "; one solver, timed once, where both pick it). "
              "immediate / find above 1 means immediate mode's choice is slower; issue 30 asks for at most 1.10."
              + (" " + _set_intro(result) if is_set else " Sums weight each layer by how often the model runs it.")
              + _subset(result)), "",
             "| model, type, layout, direction | problems | immediate ms | find ms | immediate / find (summed) | "
             "worst | worst problem | above 1.10 | other solver | failed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, s in result["summary"].items():
        if "immediate_ms" not in s:
            lines.append(f"| {key} | {s['problems']} | | | | | | | | {s['failed']} |")
            continue
        lines.append(f"| {key} | {s['problems']} | {s['immediate_ms']:.2f} | {s['find_ms']:.2f} | "
                     f"{s['immediate_over_find']:.3f} | {s['worst_immediate_over_find']:.2f} | {s['worst_layer']} | "
                     f"{s['above_1_1']} | {s['other_solver']} | {s['failed']} |")
    timed = [r for r in result["rows"] if "immediate_over_find" in r]
    worst = sorted(timed, key=lambda r: -r["immediate_over_find"])[:WORST_ROWS]
    head = ["| model | type | layout | dir | layer | N | x | immediate (how) | find's best | immediate ms | find ms | "
            "immediate / find |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def row(r: dict) -> str:
        start = f"| {r['model']} | {r['type']} | {r['layout']} | {r['direction']} | {_name(r)} | {r['batch']} | " \
                f"{r['count']} |"
        if "error" in r:
            return f"{start} failed: {r['error']} | | | | |"
        return (f"{start} {r['immediate_solver']} ({r['how']}) | {r['find_solver']} | {r['immediate_ms']:.4f} | "
                f"{r['find_ms']:.4f} | {r['immediate_over_find']:.2f} |")

    lines += ["", f"The {len(worst)} worst:", "", *head, *(row(r) for r in worst),
              "", "Every problem:", "", *head, *(row(r) for r in result["rows"])]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    _plot(result, out, stem, "immediate_over_find", 1.1, "immediate mode's time / find's best time, summed "
          "(< 1.1: within issue 30's 10%)", f"kdbkit convolution, immediate vs find, {result['device']}")


def _plot(result: dict, out: Path, stem: str, value: str, mark: float, xlabel: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    keys = [k for k, s in result["summary"].items() if value in s]
    if not keys:
        return
    values = [result["summary"][k][value] for k in keys]
    good = (lambda v: v >= mark) if value == "speedup_vs_torch" else (lambda v: v <= mark)
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(keys) + 1.5))
    ax.barh(keys, values, color=["tab:green" if good(v) else "tab:red" for v in values])
    ax.axvline(mark, color="black", lw=1, ls="--")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)
    plt.close(fig)
