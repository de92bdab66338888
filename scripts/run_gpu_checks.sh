#!/usr/bin/env bash
# The GPU run, in one go: the test suite with the CUDA backend, the main job, and the
# startup benchmark. Writes logs and results to $OUT (default ./gpu-out).
# On the lent GPU machine (no registry there), carry the wheels from
# ../shared/tools/device-wheels and call:  scripts/run_gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 KDB_CUSTOM_CACHE_DIR=$(mktemp -d)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, cuda.bindings, numpy; print(sys.version.split()[0], "cuda-bindings", cuda.bindings.__version__, "numpy", numpy.__version__)'
    python3 -m runtime.cli.app doctor
} > "$OUT/gpu_env.txt" 2>&1

echo "== full test suite (CUDA tests run; PoCL ones skip where PoCL is absent)"
python3 -m pytest -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest_all.txt" | tail -5
echo "== lookup-chain tests on the CUDA backend (KDB_TEST_BACKEND=cuda)"
KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider tests/runtime/test_resolution.py \
    tests/runtime/test_broken_caches.py tests/runtime/test_concurrency.py 2>&1 | tee "$OUT/pytest_chain_cuda.txt" | tail -5
echo "== main job on the GPU"
python3 -m runtime.cli.app demo 2>&1 | tee "$OUT/demo_gpu.txt"
echo "== startup benchmark"
python3 scripts/bench_startup.py --runs "${RUNS:-15}" --out "$OUT" 2>&1 | tee "$OUT/bench_startup.txt"
echo "== a system hit, part by part"
python3 scripts/profile_system_hit.py --runs 12 --out "$OUT/profile_system_hit.json" 2>&1 | tee "$OUT/profile_system_hit.txt"
