#!/usr/bin/env bash
# The GPU run, in one go: kdbkit built and installed as a regular wheel from this tree, the
# test suite with the CUDA backend, the chain tests again on CUDA, the main job, and the
# startup benchmark. Writes logs and results to $OUT (default ./gpu-out).
# On the lent GPU machine (no registry there), carry the wheels that
# ../shared/tools/device-wheels fetches (plus setuptools and msgpack) as .whl and call:
#   scripts/run_gpu_checks.sh            (RUNS=15 processes per benchmark mode by default)
# PART=tests or PART=bench runs one half (each fits one 10-minute call); the default runs both.
# PART=primitives runs only the primitives' CUDA tests and their benchmark (a tuning cycle).
# PART=network: kdb tune + kdb package (.gpu-bundles/ carried from the CPU machine) + bench_network.py
# (BENCH_ARGS: more of its options, e.g. --compare-prefetch).
# PART=startup: only the startup benchmark.
# PART=compare: bench_network and bench_startup of this tree and of a baseline tree (BASE=<dir>), in turn.
# PART=ab: one command (AB=...) against this tree and a baseline tree (BASE=<dir>), in turn (see there).
# PART=suite: the whole test suite with KDB_TEST_BACKEND=cuda; TUNE=1 also tunes the networks'
# problems alongside (the find-db comes back as $OUT/tuned.fdb, for PART=compare's FDB).
# PART=cluster: the cluster tier's tests on CUDA and scripts/bench_cluster.py (a redis-server in .whl: see there).
# PART=fused: the GPU tests of the fused and TMA kernels (gemm and convolution) and the models on CUDA.
# PART=install only installs (then: export PYTHONPATH=/tmp/site and run a script of scripts/).
set -uo pipefail
PART=${PART:-all}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
SITE=/tmp/site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH=$SITE
# kdbkit itself: a regular wheel of this very tree, so the run tests what is committed, installed.
rm -rf /tmp/kdbkit-wheel
python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/kdbkit-wheel . &&
    python3 -m pip install -q --no-index --no-deps --upgrade --target "$SITE" /tmp/kdbkit-wheel/kdbkit-*.whl ||
    { echo "building kdbkit's wheel failed" >&2; exit 1; }
export PYTHONUNBUFFERED=1 KDB_CUSTOM_CACHE_DIR=$(mktemp -d)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, cuda.bindings, numpy, kdbkit; print(sys.version.split()[0], "cuda-bindings", cuda.bindings.__version__, "numpy", numpy.__version__, "kdbkit", kdbkit.__version__, "from", kdbkit.__file__)'
    python3 -m kdbkit.runtime.cli.app doctor
} > "$OUT/gpu_env.txt" 2>&1
[ "$PART" = install ] && exit 0

if [ "$PART" = cluster ]; then
    # The cluster tier on the GPU: a redis-server carried in .whl/redis-server/ (the binary and the
    # shared libraries it needs, from the CPU machine: the GPU machine has no package registry;
    # make it with: mkdir -p .whl/redis-server && cp /usr/bin/redis-server .whl/redis-server/ &&
    # ldd /usr/bin/redis-server | awk '/=>/{print $3}' | grep -v -e libc.so -e libm.so -e libstdc |
    # xargs -I{} cp -L {} .whl/redis-server/), run through a wrapper so that only it sees those
    # libraries; then the tier's tests with the CUDA backend and scripts/bench_cluster.py (NODES nodes).
    CARRIED=$PWD/.whl/redis-server
    mkdir -p /tmp/redis-bin
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s/redis-server "$@"\n' "$CARRIED" "$CARRIED" > /tmp/redis-bin/redis-server
    chmod +x /tmp/redis-bin/redis-server
    export PATH=/tmp/redis-bin:$PATH
    redis-server --version > "$OUT/redis_version.txt" 2>&1 || { cat "$OUT/redis_version.txt"; exit 1; }
    echo "== the cluster tier's tests, KDB_TEST_BACKEND=cuda"
    KDB_TEST_BACKEND=cuda KDB_TEST_REQUIRE=redis-server python3 -m pytest -q -rs -p no:cacheprovider \
        tests/runtime/test_redis_tier.py tests/runtime/test_cluster_nodes.py tests/runtime/test_shared_rankings.py \
        tests/runtime/test_entry_signing.py tests/packager/test_publish.py 2>&1 | tee "$OUT/pytest_cluster_cuda.txt" | tail -8
    echo "== bench_cluster"
    python3 scripts/bench_cluster.py --nodes "${NODES:-8}" --out "$OUT" 2>&1 | tee "$OUT/bench_cluster.txt" | tail -25
    exit 0
fi
if [ "$PART" = suite ]; then
    if [ -n "${TUNE:-}" ]; then
        python3 scripts/bench_network.py --write-catalogue /tmp/net_catalogue.txt
        (python3 -m kdbkit.runtime.cli.app tune -c /tmp/net_catalogue.txt -o /tmp/tuned > "$OUT/tune.txt" 2>&1 &&
            cp /tmp/tuned/*.fdb "$OUT/tuned.fdb") &
    fi
    echo "== the whole suite, KDB_TEST_BACKEND=cuda"
    KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider --durations=15 2>&1 |
        tee "$OUT/pytest_suite_cuda.txt" | tail -40
    wait
    exit 0
fi
if [ "$PART" = network ]; then
    # The issue-10 story on the GPU: the bundle built on the CPU machine (.gpu-bundles/, carried),
    # a find-db tuned here for the networks' problems, both packaged, installed, and timed.
    KDB="python3 -m kdbkit.runtime.cli.app"
    # FDB=<file>: package that find-db (tuned by an earlier run) instead of tuning again
    if [ -z "${FDB:-}" ]; then
        python3 scripts/bench_network.py --write-catalogue /tmp/net_catalogue.txt
        echo "== kdb tune"
        $KDB tune -c /tmp/net_catalogue.txt -o /tmp/tuned 2>&1 | tail -3
        FDB=$(ls /tmp/tuned/*.fdb)
    fi
    echo "== kdb package"
    $KDB package .gpu-bundles/*.kdb --find-db "$FDB" -o "$OUT/wheels"
    echo "== bench_network"
    python3 scripts/bench_network.py --packages "$OUT/wheels" --runs "${RUNS:-5}" --jit-runs "${JIT_RUNS:-1}" ${BENCH_ARGS:-} \
        --out "$OUT" 2>&1 | tee "$OUT/bench_network.txt" | tail -30
    exit 0
fi
if [ "$PART" = fused ]; then
    echo "== the fused and TMA kernels on CUDA"
    KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/runtime/primitives/test_gemm_fused.py \
        tests/runtime/primitives/test_convolution_fused.py tests/runtime/primitives/test_gemm_tma.py \
        tests/runtime/primitives/test_convolution_tma.py 2>&1 | tee "$OUT/pytest_fused_cuda.txt" | tail -8
    echo "== the models on CUDA"
    KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider tests/runtime/models 2>&1 |
        tee "$OUT/pytest_models_cuda.txt" | tail -5
    exit 0
fi
if [ "$PART" = primitives ]; then
    echo "== the primitives' tests on CUDA"
    KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider tests/runtime/primitives 2>&1 |
        tee "$OUT/pytest_primitives_cuda.txt" | tail -8
    echo "== the primitives against PyTorch"
    python3 scripts/bench_primitives.py --out "$OUT" 2>&1 | tee "$OUT/bench_primitives.txt" | tail -40
    exit 0
fi
# The baseline tree (BASE=<folder holding it>, carried) installed as its own wheel beside this
# tree's dependencies, in BASE_SITE: PART=compare and PART=ab measure both trees in one call.
BASE_SITE=/tmp/site-base
install_baseline() {
    [ -d "${BASE:-}" ] ||
        { echo "BASE=<folder holding the baseline tree> is needed (e.g. git archive main)" >&2; exit 1; }
    rm -rf "$BASE_SITE" /tmp/kdbkit-base-wheel && cp -r "$SITE" "$BASE_SITE"
    (cd "$BASE" && python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/kdbkit-base-wheel .) &&
        python3 -m pip install -q --no-index --no-deps --upgrade --target "$BASE_SITE" /tmp/kdbkit-base-wheel/kdbkit-*.whl ||
        { echo "building the baseline's wheel failed" >&2; exit 1; }
}
if [ "$PART" = ab ]; then
    # One command against two trees in one call, the baseline first: AB, run from each tree's root
    # with that tree's kdbkit on PYTHONPATH, a fresh user cache, and AB_OUT a folder of its own
    # (e.g. AB='python3 scripts/bench_conv.py --set problems --types fp16 --layouts NCHW --out
    # $AB_OUT'). Each side's log and JSON files come back as $OUT/<base|new>-<name>; the device
    # tool returns 8 files at most, so AB should write few.
    [ -n "${AB:-}" ] || { echo "AB=<command> is needed" >&2; exit 1; }
    install_baseline
    for side in base new; do
        tree=.; site=$SITE
        [ $side = base ] && { tree=$BASE; site=$BASE_SITE; }
        AB_OUT=$(mktemp -d)
        (cd "$tree" && AB_OUT=$AB_OUT PYTHONPATH=$site KDB_CUSTOM_CACHE_DIR=$(mktemp -d) bash -c "$AB") \
            > "$OUT/$side-ab.log" 2>&1
        echo "== $side (exit $?)"; tail -3 "$OUT/$side-ab.log"
        for f in "$AB_OUT"/*.json; do [ -e "$f" ] && cp "$f" "$OUT/$side-$(basename "$f")"; done
    done
    exit 0
fi
if [ "$PART" = compare ]; then
    # No regression against a baseline tree (BASE=<folder holding it>, carried): each tree's own
    # kdbkit wheel, `kdb package` and benchmark scripts, the same bundle (.gpu-bundles/, carried)
    # and the same find-db (FDB=<file>, else tuned here with this tree), measured in turn in this
    # one call: bench_network (WHAT=network), bench_startup (WHAT=startup) or both (the default).
    KDB="python3 -m kdbkit.runtime.cli.app"
    install_baseline
    WHAT=${WHAT:-network,startup}
    if [[ $WHAT == cold ]]; then
        # A user's very first process (no startup memo, so no prefetch): each tree's bundle child,
        # alternating, COLD_RUNS times, each in fresh user folders; then once each under cProfile.
        for side in base new; do
            tree=.; site=$SITE
            [ $side = base ] && { tree=$BASE; site=$BASE_SITE; }
            rm -rf "/tmp/venv-$side"
            PYTHONPATH=$site $KDB package .gpu-bundles/*.kdb --find-db "$FDB" -o "/tmp/wheels-$side" >/dev/null &&
            PYTHONPATH=$site:scripts python3 -c "import sys; from pathlib import Path; from bench_network import install_into_venv
install_into_venv(Path(sys.argv[1]), Path(sys.argv[2]))" "/tmp/wheels-$side" "/tmp/venv-$side" || exit 1
        done
        cold() {  # side, then extra interpreter arguments
            local side=$1 tree=. site=$SITE; shift
            [ $side = base ] && { tree=$BASE; site=$BASE_SITE; }
            env -u KDB_CUSTOM_CACHE_DIR XDG_CACHE_HOME="$(mktemp -d)" XDG_DATA_HOME="$(mktemp -d)" KDB_DISABLE_JIT=1 \
                KDB_BACKEND=cuda CUDA_CACHE_DISABLE=1 PYTHONPATH=$site "/tmp/venv-$side/bin/python" "$@" \
                "$tree/scripts/bench_network.py" --child bundle "${NETWORKS:-resnet50}"
        }
        for i in $(seq "${COLD_RUNS:-5}"); do
            for side in base new; do cold $side >> "$OUT/cold_$side.jsonl"; echo >> "$OUT/cold_$side.jsonl"; done
        done
        [ -n "${COLD_PROFILE:-}" ] && for side in base new; do cold $side -m cProfile -o "$OUT/cold_$side.prof" > /dev/null; done
        exit 0
    fi
    if [[ $WHAT == *network* ]]; then
        if [ -z "${FDB:-}" ]; then
            python3 scripts/bench_network.py --write-catalogue /tmp/net_catalogue.txt
            $KDB tune -c /tmp/net_catalogue.txt -o /tmp/tuned 2>&1 | tail -2
            FDB=$(ls /tmp/tuned/*.fdb)
        fi
    fi
    for side in ${ORDER:-base new}; do  # ORDER="new base" to see whether a figure follows the position
        tree=.; site=$SITE
        [ $side = base ] && { tree=$BASE; site=$BASE_SITE; }
        mkdir -p "$OUT/$side"
        if [[ $WHAT == *network* ]]; then
            echo "== bench_network, $side (load $(cut -d' ' -f1-3 /proc/loadavg))"
            PYTHONPATH=$site $KDB package .gpu-bundles/*.kdb --find-db "$FDB" -o "/tmp/wheels-$side" >/dev/null &&
            PYTHONPATH=$site python3 "$tree/scripts/bench_network.py" --packages "/tmp/wheels-$side" --runs "${RUNS:-5}" \
                --jit-runs 1 --networks "${NETWORKS:-resnet50,bert_base}" --out "$OUT/$side" 2>&1 | tail -12
        fi
        if [[ $WHAT == *startup* ]]; then
            echo "== bench_startup, $side"
            PYTHONPATH=$site python3 "$tree/scripts/bench_startup.py" --runs "${STARTUP_RUNS:-15}" --out "$OUT/$side" \
                2>&1 | tail -30
        fi
    done
    rm -f "$OUT"/*/*.png  # what comes back is at most 8 files: each side's JSON and report
    exit 0
fi
if [ "$PART" = startup ]; then
    python3 scripts/bench_startup.py --runs "${RUNS:-15}" --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_startup.txt"
    exit 0
fi
if [ "$PART" != bench ]; then
echo "== full test suite (CUDA tests run; PoCL and clang ones skip where those are absent)"
python3 -m pytest -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest_all.txt" | tail -5
echo "== lookup-chain tests on the CUDA backend (KDB_TEST_BACKEND=cuda)"
KDB_TEST_BACKEND=cuda python3 -m pytest -q -rs -p no:cacheprovider tests/runtime/test_resolution.py \
    tests/runtime/test_broken_caches.py tests/runtime/test_concurrency.py tests/runtime/test_lookup_chain.py \
    tests/runtime/test_user_kernels.py tests/runtime/test_cache_admin.py tests/runtime/cli/test_runtime_commands.py \
    tests/runtime/primitives tests/runtime/models \
    2>&1 | tee "$OUT/pytest_chain_cuda.txt" | tail -5
echo "== main job on the GPU"
python3 -m kdbkit.runtime.cli.app demo --workdir "$(mktemp -d)" 2>&1 | tee "$OUT/demo_gpu.txt"
fi
[ "$PART" = tests ] && exit 0
echo "== startup benchmark"
python3 scripts/bench_startup.py --runs "${RUNS:-15}" --out "$OUT" 2>&1 | tee "$OUT/bench_startup.txt"
echo "== the primitives against PyTorch"
python3 scripts/bench_primitives.py --out "$OUT" 2>&1 | tee "$OUT/bench_primitives.txt"
