#!/usr/bin/env bash
# Nsight Compute on kdbkit's kernels in one benchmark case, on the GPU machine:
#   scripts/profile_kernels.sh "<case, e.g. max pool 3x3/2 fp16>" "<kernel-name regex>" [launches]
# Writes $OUT/ncu_<n>.txt (the full report) and prints its key lines.
set -uo pipefail
CASE=$1 KERNELS=$2 COUNT=${3:-3}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
cd "$(dirname "$0")"
n=$(ls "$OUT"/ncu_*.txt 2>/dev/null | wc -l)
report="$OUT/ncu_$n.txt"
ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats -k "regex:$KERNELS" --launch-skip 2 --launch-count "$COUNT" \
    python3 bench_primitives.py --only "$CASE" --iters 1 --blocks 1 > "$report" 2>&1
grep -E "^  [a-z_]+\(|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|smsp__pcsamp|One or More|No Eligible|Stall" "$report" | head -60
