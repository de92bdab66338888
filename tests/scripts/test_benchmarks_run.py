"""Each benchmark of scripts/ behind README's figures runs in its small mode, so it cannot rot.

The scripts are run as a user runs them (a fresh ``python scripts/<name>.py`` process), writing
into a temporary folder, never into docs/. What runs on the CPU runs here; what needs a CUDA GPU
(with PyTorch seeing it) skips with that reason and runs on the GPU machine
(scripts/run_gpu_checks.sh runs the suite there). Each test checks what the run wrote, not only
its exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prerequisites import require_amdgcn_clang, require_nvrtc, skip_or_fail
from tests.runtime.chain_fixtures import chain_backend_name, pick_device

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def run_script(name: str, *args: str, cwd: Path, own_folders: bool = True, timeout: int = 900,
               **extra_env: str) -> subprocess.CompletedProcess:
    """``python scripts/<name> ARGS`` in ``cwd``, with no KDB_* setting of this process (but the
    tests' own KDB_TEST_*) and, with ``own_folders``, per-user folders of its own; fails the test
    with the script's output when it exits non-zero."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_") or k.startswith("KDB_TEST_")}
    env["PYTHONUNBUFFERED"] = "1"
    if own_folders:
        env.update(KDB_CUSTOM_CACHE_DIR=str(cwd / "cache"), KDB_USER_DB_PATH=str(cwd / "userdb"),
                   XDG_CACHE_HOME=str(cwd / "xdg-cache"), XDG_DATA_HOME=str(cwd / "xdg-data"))
    env.update(extra_env)
    done = subprocess.run([sys.executable, str(SCRIPTS / name), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def require_cuda_and_torch() -> None:
    """Skip unless kdbkit sees a CUDA device and PyTorch sees it too (the GPU benchmarks time
    kdbkit next to PyTorch on the same tensors)."""
    from kdbkit.runtime.backends.registry import discover_devices

    if not any(d.backend == "cuda" for d in discover_devices()):
        pytest.skip("needs a CUDA GPU: this benchmark times kdbkit on CUDA (scripts/run_gpu_checks.sh runs it)")
    try:
        import torch
    except ImportError:
        pytest.skip("needs PyTorch with CUDA: this benchmark compares against PyTorch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA: this benchmark compares against PyTorch")


def test_bench_startup_handle_only_runs_on_the_default_device(tmp_path):
    out = tmp_path / "out"
    run_script("bench_startup.py", "--handle-only", "--runs", "2", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_startup.json").read_text())
    counts = result["handle_files"]["file_counts"]
    assert len(counts) == 2 and counts[0] < counts[1]
    report = (out / "bench_startup.md").read_text()
    assert "Making a handle with" in report and ("PASS" in report or "FAIL" in report)
    assert (out / "bench_startup.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_network_smoke_serves_both_networks_from_the_installed_bundle(tmp_path):
    pick_device()  # the test backend's device (KDB_TEST_BACKEND: PoCL here, CUDA on the GPU machine), else a skip
    done = run_script("bench_network.py", "--smoke", "--profile-first", cwd=tmp_path, KDB_BACKEND=chain_backend_name())
    # The script itself fails unless every bundle process resolved every program from the bundle.
    for name in ("resnet50", "bert_base"):
        assert f"{name} {{'bundle': [" in done.stdout
        assert f"{name} first result profiled, most own time: " in done.stdout


@pytest.mark.slow
def test_bench_kdb_quick_on_a_small_corpus(tmp_path):
    require_nvrtc()
    out = tmp_path / "out"
    run_script("bench_kdb.py", "--quick", "--corpus-scale", "0.03", "--sizes", "300", "--open-runs", "3",
               "--lookups", "100", "--lookup-runs", "1", "--jobs", "2", "--work-dir", str(tmp_path / "work"),
               "--corpus-dir", str(tmp_path / "corpus"), "--out-dir", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_kdb.json").read_text())
    assert json.dumps(result)  # written and parseable
    report = (out / "bench_kdb.md").read_text()
    assert "300" in report and "open_bundle" in report


@pytest.mark.slow
def test_bench_build_quick_on_one_gfx_arch(tmp_path):
    require_amdgcn_clang()
    out = tmp_path / "out"
    run_script("bench_build.py", "--quick", "--repeats", "1", "--throughput-targets", "gfx90a",
               "--rebuild-targets", "gfx90a", "-j", "2", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_build.json").read_text())
    assert result["rebuild"]["compiled_nothing"], result["rebuild"]
    assert result["throughput"] and result["sizes"]
    assert "Unchanged rebuild" in (out / "bench_build.md").read_text()


@pytest.mark.gpu
def test_bench_startup_full_on_cuda(tmp_path):
    require_cuda_and_torch()
    out = tmp_path / "out"
    run_script("bench_startup.py", "--runs", "1", "--diagnose", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_startup.json").read_text())
    assert result["system"]["sources_seen"] == ["system"] and result["breakdown_ms"]


@pytest.mark.gpu
def test_bench_primitives_one_case_on_cuda(tmp_path):
    require_cuda_and_torch()
    done = run_script("bench_primitives.py", "--only", "relu fp16", "--iters", "2", "--blocks", "1",
                      "--placements", "1", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert "placement 0:" in done.stdout  # at least one case matched and ran
    assert "of a same-size copy" in done.stdout  # a memory-bound case beside a copy of its bytes


@pytest.mark.gpu
def test_bench_conv_first_layers_on_cuda(tmp_path):
    require_cuda_and_torch()
    out = tmp_path / "out"
    run_script("bench_conv.py", "--layers", "2", "--models", "resnet50", "--types", "fp32", "--directions", "F",
               "--iters", "1", "--blocks", "1", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_conv.json").read_text())
    assert len(result["rows"]) == 4  # two layers, NCHW and channels-last


def test_hip_python_calls_doc_is_what_the_script_writes(tmp_path):
    """docs/hip_python_calls.md lists the hip-python calls kdbkit makes, per release line:
    regenerated, it must be unchanged (a new call, or a line added, means running the script)."""
    from tests.hip_standin import hip_python_folder, hip_python_lines

    missing = [line for line in hip_python_lines() if hip_python_folder(line) is None]
    if missing:
        skip_or_fail("hip-standin", f"hip-python {', '.join(missing)} not installed: run "
                                    "scripts/install_hip_python_lines.sh")
    written = tmp_path / "hip_python_calls.md"
    run_script("hip_python_signatures.py", "--out", str(written), cwd=tmp_path, own_folders=False)  # the lines' folder
    assert written.read_text() == (ROOT / "docs" / "hip_python_calls.md").read_text(), (
        "docs/hip_python_calls.md is stale: run python scripts/hip_python_signatures.py")


@pytest.mark.slow
def test_bench_cluster_runs_two_nodes_on_the_default_device(tmp_path):
    from tests.prerequisites import require_redis_server

    pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
    out = tmp_path / "out"
    run_script("bench_cluster.py", "--nodes", "2", "--out", str(out), "--redis-server", require_redis_server(),
               cwd=tmp_path)
    data = json.loads((out / "bench_cluster.json").read_text())
    assert data["together"]["compiles"] == data["alone"]["compiles"] == data["programs"] > 0  # compiled once
    assert set(data["warm_tier"]["sources"]) == {"remote"} and set(data["local_warm"]["sources"]) == {"user"}
    assert data["warm_tier"]["compiles"] == 0 and (out / "bench_cluster.md").exists()


@pytest.mark.gpu
def test_bench_primitives_gemm_set_in_a_graph_on_cuda(tmp_path):
    require_cuda_and_torch()
    done = run_script("bench_primitives.py", "--set", "gemm", "--graph", "2", "--only", "attention output 768x768 bf16",
                      "--iters", "2", "--blocks", "1", "--placements", "1", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert "placement 0: gemm BERT attention output 768x768" in done.stdout and "no CUDA graph" not in done.stdout


@pytest.mark.gpu
def test_bench_conv_problem_set_in_a_graph_on_cuda(tmp_path):
    require_cuda_and_torch()
    out = tmp_path / "out"
    done = run_script("bench_conv.py", "--set", "problems", "--layers", "3", "--types", "fp16", "--graph", "2",
                      "--iters", "1", "--blocks", "1", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_conv_set_graph.json").read_text())
    assert len(result["rows"]) == 6 and not result["failed"]  # three problems, NCHW and channels-last, forward
    assert "no CUDA graph" not in done.stdout
    assert "below 0.3x" in (out / "bench_conv_set_graph.md").read_text()


@pytest.mark.gpu
def test_bench_conv_compare_find_on_cuda(tmp_path):
    require_cuda_and_torch()
    out = tmp_path / "out"
    run_script("bench_conv.py", "--compare-find", "--models", "resnet50", "--layers", "1", "--types", "fp16",
               "--directions", "F", "--iters", "1", "--blocks", "1", "--out", str(out), cwd=tmp_path)
    result = json.loads((out / "bench_conv_compare.json").read_text())
    assert len(result["rows"]) == 2 and all(r["immediate_over_find"] > 0 for r in result["rows"])


def test_bench_host_time_times_both_ways_on_the_default_device(tmp_path):
    out = tmp_path / "out"
    run_script("bench_host_time.py", "--networks", "bert_base", "--forwards", "2", "--out", str(out), cwd=tmp_path)
    (row,) = json.loads((out / "bench_host_time.json").read_text())["rows"]
    assert row["network"] == "bert_base" and row["launches"] > 12  # every layer launches
    assert row["issue_ms"] > 0 and row["kdbkit_ms"] > 0
    assert "| bert_base |" in (out / "bench_host_time.md").read_text()
