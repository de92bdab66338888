"""scripts/bench_conv.py's layer lists, its options and its reports, on the CPU (no PyTorch):
the models' layers against their published multiply-add counts, ResNeXt-50's real shapes, the
benchmark set's size and spread, a bad option's one line, and the set's and --compare-find's
reports from given rows. The runs on a GPU are in test_benchmarks_run.py."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


@pytest.fixture
def scripts(monkeypatch):
    """The scripts folder importable, as it is when a script runs."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_conv
    import conv_problems
    import conv_report

    return bench_conv, conv_problems, conv_report


def macs_per_image(layers) -> float:
    return sum(c.count * c.flops / 2 / c.n for c in layers)


def test_models_match_their_published_multiply_adds(scripts):
    _, cp, _ = scripts
    # torchvision's figures (GFLOPS there: multiply-adds of the convolutions and the classifier)
    for model, published, convs in (("resnet50", 4.09, 53), ("resnext50", 4.23, 53), ("mobilenet_v2", 0.30, 52)):
        layers = cp.MODELS[model]()
        assert sum(c.count for c in layers) == convs, model
        assert macs_per_image(layers) / 1e9 == pytest.approx(published, abs=0.01), model
        assert {c.n for c in layers} == {cp.BATCH}


def test_resnext50_is_torchvisions_32x4d(scripts):
    _, cp, _ = scripts
    rows = {(c.c, c.h, c.k, c.filter, c.stride, c.groups, c.count) for c in cp.resnext50()}
    expected = {(3, 224, 64, (7, 7), (2, 2), 1, 1)}
    cin, size = 64, 56
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width, out, stride = 128 << stage, 256 << stage, (1 if stage == 0 else 2)
        expected |= {(cin, size, width, (1, 1), (1, 1), 1, 1), (width, size, width, (3, 3), (stride, stride), 32, 1),
                     (cin, size, out, (1, 1), (stride, stride), 1, 1)}
        size //= stride
        expected |= {(width, size, out, (1, 1), (1, 1), 1, blocks), (out, size, width, (1, 1), (1, 1), 1, blocks - 1),
                     (width, size, width, (3, 3), (1, 1), 32, blocks - 1)}
        cin = out
    assert rows == expected
    grouped = [c for c in cp.resnext50() if c.groups > 1]
    assert {c.c // c.groups for c in grouped} == {4, 8, 16, 32}  # 32 groups of 4 to 32 channels, never depthwise


def test_only_takes_several_texts_as_bench_conv_solvers_does(scripts):
    bc, _, _ = scripts
    picked = bc.selected(bc.parse_args(["--set", "problems", "--only", "ASPP 3x3,conv1 7x7/2"]))
    names = [c.name for _, layers in picked for c in layers]
    assert names and all("ASPP 3x3" in n or "conv1 7x7/2" in n for n in names)
    assert any("ASPP 3x3" in n for n in names) and any("conv1 7x7/2" in n for n in names)
    every = bc.selected(bc.parse_args(["--set", "problems"]))
    assert sum(len(layers) for _, layers in every) > len(names)


def test_problem_set_has_200_distinct_problems_of_every_kind(scripts):
    _, cp, _ = scripts
    from kdbkit.runtime.primitives.convolution import ConvProblem  # noqa: F401  (kdbkit checks each shape)
    from kdbkit.runtime.tensor import DataType

    problems = cp.problem_set()
    assert len(problems) >= 200
    assert len({p.shape for p in problems}) == len(problems) and len({p.name for p in problems}) == len(problems)
    nets = Counter(p.name.split(" ", 1)[0] for p in problems)
    assert set(nets) == set(cp.SET_NETWORKS) and min(nets.values()) >= 6
    batches = {p.n for p in problems}
    assert min(batches) == 1 and max(batches) == 256 and len(batches) >= 12
    for p in problems:
        assert p.elements() <= cp.SET_ELEMENTS_CAP or p.n == 1, p
        assert p.n == cp.capped_batch(p, p.n)
        for direction in "FBW":
            problem = p.problem(direction, DataType.FP16, "NHWC")
            assert problem.y_shape[2:] == p.out_hw and problem.flops == p.flops
    kinds = {
        "strided": [p for p in problems if max(p.stride) > 1],
        "dilated 2 and 4": [p for p in problems if p.dilation in ((2, 2), (4, 4))],
        "dilated 12 to 36": [p for p in problems if max(p.dilation) >= 12],
        "grouped 32": [p for p in problems if p.groups == 32 and p.c > 32],
        "grouped 64": [p for p in problems if p.groups == 64 and p.c > 64],
        "depthwise 3x3": [p for p in problems if p.groups == p.c > 1 and p.filter == (3, 3)],
        "depthwise 5x5": [p for p in problems if p.groups == p.c > 1 and p.filter == (5, 5)],
        "1x7 and 7x1": [p for p in problems if p.filter in ((1, 7), (7, 1))],
        "1x3 and 3x1": [p for p in problems if p.filter in ((1, 3), (3, 1))],
        "unpadded": [p for p in problems if p.pad == (0, 0) and p.filter != (1, 1)],
        "one input channel": [p for p in problems if p.c == 1],
        "255 outputs": [p for p in problems if p.k == 255],
    }
    assert all(found for found in kinds.values()), {k: len(v) for k, v in kinds.items()}
    sizes = {p.h for p in problems}
    assert {299, 149, 147, 73, 35, 17, 8, 513, 129, 65, 97, 572, 13} <= sizes


def test_a_spread_subset_visits_every_network(scripts):
    _, cp, _ = scripts
    problems = cp.problem_set()
    subset = cp.spread(problems, 28)
    assert len(subset) == 28 and len(set(subset)) == 28
    assert {p.name.split(" ", 1)[0] for p in subset} == set(cp.SET_NETWORKS)
    assert cp.spread(problems, None) == problems == cp.spread(problems, 10_000)


def test_options_take_directions_with_commas(scripts):
    bench_conv, _, _ = scripts
    assert bench_conv.parse_args(["--directions", "W,F"]).directions == "WF"
    args = bench_conv.parse_args(["--set", "problems"])
    assert args.directions == "F" and bench_conv.stem_of(args) == "bench_conv_set"
    args = bench_conv.parse_args(["--compare-find", "--graph", "4", "--types", "fp16,bf16"])
    assert args.models == ["resnet50", "mobilenet_v2", "resnext50"] and args.types == ["fp16", "bf16"]
    assert bench_conv.stem_of(args) == "bench_conv_compare_graph"


@pytest.mark.parametrize("bad, named", [
    (["--directions", "W,X"], "--directions"), (["--types", "fp8"], "--types"), (["--models", "resnet51"], "--models"),
    (["--graph", "-1"], "--graph"), (["--iters", "many"], "--iters"), (["--find", "--compare-find"], "--find"),
    (["--set", "problems", "--models", "resnet50"], "--models"), (["--frobnicate"], "--frobnicate"),
])
def test_a_bad_option_is_one_line_and_status_2(bad, named):
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_conv.py"), *bad], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""


def _rows(model: str, ratios, compared: bool) -> list[dict]:
    rows = []
    for i, ratio in enumerate(ratios):
        row = {"model": model, "net": "vgg16" if model == "set" else model, "type": "fp16", "layout": "NHWC",
               "direction": "F", "layer": f"layer {i}", "count": 1 if model == "set" else 2, "batch": 8, "key": "k"}
        if ratio is None:
            row["error"] = "NoSolverError: none applies"
        elif compared:
            row.update(immediate_solver="A", how="heuristic", find_solver="A" if ratio == 1 else "B",
                       immediate_ms=ratio, find_ms=1.0, immediate_over_find=ratio, find_ranked=3, find_own_ms=1.0)
        else:
            row.update(solver="A", kdbkit_ms=1.0, torch_ms=ratio, speedup_vs_torch=ratio, kdbkit_tflops=1.0,
                       torch_tflops=ratio)
        rows.append(row)
    return rows


def _result(rows, summary, **extra) -> dict:
    return {"device": "a GPU", "batch": 32, "iters": 5, "blocks": 3, "mode": "immediate", "set": "models",
            "layers": None, "only": "", "graph_calls": 0, "commit": "abc", "torch": "t", "cudnn": 1, "kdbkit": "k",
            "summary": summary, "failed": sum("error" in r for r in rows), "rows": rows, **extra}


def test_the_set_report_gives_the_sum_the_lowest_and_the_counts_below(scripts, tmp_path):
    bench_conv, cp, conv_report = scripts
    rows = _rows("set", [0.25, 0.5, 2.0, 1.25, None], compared=False)
    summary = bench_conv.summarise(rows, compared=False)
    s = summary["set fp16 NHWC F"]
    assert s["speedup_vs_torch"] == pytest.approx(4.0 / 4) and s["min_speedup"] == 0.25
    assert (s["below_0_3"], s["below_0_8"], s["problems"], s["failed"]) == (1, 2, 5, 1)
    assert s["min_layer"] == "vgg16 layer 0"
    result = _result(rows, summary, set="problems", batch="per problem", networks=list(cp.SET_NETWORKS),
                     batches=sorted(cp.SET_BATCHES), elements_cap=cp.SET_ELEMENTS_CAP)
    conv_report.write_report(result, tmp_path, "bench_conv_set")
    text = (tmp_path / "bench_conv_set.md").read_text()
    assert "| set fp16 NHWC F | 5 | 4.00 | 4.00 | 1.000 | 0.25 | vgg16 layer 0 | 1 | 2 | 1 |" in text
    assert "268,435,456 elements" in text and "failed: NoSolverError" in text


def test_the_models_report_keeps_its_format(scripts, tmp_path):
    bench_conv, _, conv_report = scripts
    rows = _rows("resnet50", [0.5, 1.0], compared=False)
    conv_report.write_report(_result(rows, bench_conv.summarise(rows, compared=False)), tmp_path, "bench_conv")
    lines = (tmp_path / "bench_conv.md").read_text().splitlines()
    assert lines[0] == "# Convolution against PyTorch (cuDNN) on a GPU"
    assert lines[2].startswith("Written by `python scripts/bench_conv.py` at commit abc (batch 32; cuDNN 1 in "
                               "benchmark mode, TF32 off; kdbkit's solver from immediate mode; median of 3 blocks "
                               "of 5 calls, the libraries' blocks alternating). Sums weight")
    assert "| resnet50 fp16 NHWC F | 4.00 | 3.00 | 0.750 |" in lines
    assert "| resnet50 | fp16 | NHWC | F | layer 0 | 2 | A | 1.000 | 0.500 | 0.50 | 1.0 | 0.5 |" in lines


def test_the_compare_report_gives_immediate_over_find(scripts, tmp_path):
    bench_conv, cp, conv_report = scripts
    rows = _rows("set", [1.0, 1.05, 1.5, None], compared=True)
    summary = bench_conv.summarise(rows, compared=True)
    s = summary["set fp16 NHWC F"]
    assert s["immediate_over_find"] == pytest.approx(3.55 / 3) and s["worst_immediate_over_find"] == 1.5
    assert (s["above_1_1"], s["other_solver"], s["failed"]) == (1, 2, 1)
    result = _result(rows, summary, mode="compare-find", set="problems", networks=list(cp.SET_NETWORKS),
                     batches=sorted(cp.SET_BATCHES), elements_cap=cp.SET_ELEMENTS_CAP)
    conv_report.write_compare_report(result, tmp_path, "bench_conv_set_compare")
    text = (tmp_path / "bench_conv_set_compare.md").read_text()
    assert "| set fp16 NHWC F | 4 | 3.55 | 3.00 | 1.183 | 1.50 | vgg16 layer 2 | 1 | 2 | 1 |" in text
    assert "| set | fp16 | NHWC | F | vgg16 layer 2 | 8 | 1 | A (heuristic) | B | 1.5000 | 1.0000 | 1.50 |" in text


def test_merge_reports_runs_split_over_calls(scripts, tmp_path):
    """A set split over several calls (--only), one of them stopped by a time limit, reported as one."""
    bench_conv, cp, _ = scripts
    import json

    extra = dict(set="problems", batch="per problem", networks=list(cp.SET_NETWORKS), batches=sorted(cp.SET_BATCHES),
                 elements_cap=cp.SET_ELEMENTS_CAP, graph_calls=5)
    first, second = _rows("set", [0.5, 2.0], compared=False), _rows("set", [0.25], compared=False)
    (tmp_path / "a.json").write_text(json.dumps(_result(first, {}, only="vgg16", **extra)))
    (tmp_path / "b.json").write_text(json.dumps(_result(second, {}, only="unet", partial=True, commit="def", **extra)))
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_conv.py"), "--merge", str(tmp_path / "a.json"),
                           str(tmp_path / "b.json"), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "out" / "bench_conv_set_graph.json").read_text())
    assert len(merged["rows"]) == 3 and merged["commit"] == "abc, def" and "partial" not in merged
    s = merged["summary"]["set fp16 NHWC F"]
    assert (s["problems"], s["below_0_3"], s["min_speedup"]) == (3, 1, 0.25)
    text = (tmp_path / "out" / "bench_conv_set_graph.md").read_text()
    assert "only 'unet', **stopped before its end**" in text and "| set fp16 NHWC F | 3 |" in text
    (tmp_path / "c.json").write_text(json.dumps(_result(first, {}, mode="compare-find", **extra)))
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_conv.py"), "--merge", str(tmp_path / "a.json"),
                           str(tmp_path / "c.json"), str(tmp_path / "missing.json")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "another kind" in done.stderr


def test_the_solvers_script_keeps_the_layers_and_solvers_asked_for(scripts, tmp_path):
    """bench_conv_solvers.py: the layers each option keeps, every solver that applies (or those
    named), and a bad option in one line."""
    import bench_conv_solvers as solvers

    from kdbkit.runtime.tensor import DataType
    from tests.runtime.primitives.conftest import sm90

    grouped = solvers.layers(solvers.parse_args(["--models", "mobilenet_v2", "--only-grouped"]))
    assert grouped and all(layer.groups > 1 and model == "mobilenet_v2" for model, layer in grouped)
    three = solvers.layers(solvers.parse_args(["--only-3x3"]))
    assert three and all(layer.filter == (3, 3) and layer.stride == (1, 1) for _, layer in three)
    layers = {layer.name: layer for layer in scripts[1].mobilenet_v2()}
    depthwise = layers["depthwise 3x3/1 144 @56"].problem("F", DataType.FP16, "NHWC")
    assert {"ConvDepthwise", "ConvGroupedTensorCore"} <= set(solvers.candidates(depthwise, sm90(), []))
    pointwise = layers["project 1x1 960>320 @7"].problem("F", DataType.FP32, "NCHW")
    assert {"ConvImplicitGemm", "ConvIm2colGemm"} <= set(solvers.candidates(pointwise, sm90(), []))
    assert solvers.candidates(pointwise, sm90(), ["ConvIm2colGemm", "ConvDepthwise"]) == ["ConvIm2colGemm"]
    for bad in (["--types", "fp8"], ["--directions", "FX"], ["--models", "lenet"], ["--iters", "0"]):
        done = subprocess.run([sys.executable, str(SCRIPTS / "bench_conv_solvers.py"), "--out", str(tmp_path), *bad],
                              capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, (bad, done.stderr)
