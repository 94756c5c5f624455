#!/usr/bin/env bash
# Device call: ncu summary of the SM90 kernel on two shapes, then dbias-off timings.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for s in qwen3 mixtral; do
  timeout 200 ncu --clock-control none --kernel-name regex:Dglu --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 benchmarks/profile_one.py $s > "$OUT/ncu_$s.txt" 2>&1
  echo "ncu $s rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Local Memory|Stall|L2 Hit|DRAM Throughput" "$OUT/ncu_$s.txt" | head -14
done
