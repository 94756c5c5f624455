#!/usr/bin/env bash
# Device call: ncu on qwen3 (no dbias: the main kernel is the only launch) of the default
# (ping-pong) kernel, the cooperative 128x256 variant and CUTLASS's grouped GEMM behind
# torch._grouped_mm, same inputs; summary lines printed, full reports in $OUT. Why the
# cooperative schedule (same CTA tile as CUTLASS's) loses: compare tensor-pipe utilization,
# warp stall reasons and shared-memory pipe load.
#   source .gpu/env/setup.sh && bash benchmarks/device_profile_schedules.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section LaunchStats"
prof() { local tag=$1 kname=$2 skip=$3; shift 3
  timeout 170 ncu --clock-control none --kernel-name "regex:$kname" --launch-skip "$skip" --launch-count 1 \
    $SECTIONS python3 benchmarks/profile_one.py qwen3 "$@" > "$OUT/ncu_$tag.txt" 2>&1
  echo "== $tag rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Stall|Issue Slots|Shared|Tensor|No Eligible|Grid Size|Registers|L2 Hit|DRAM Throughput" "$OUT/ncu_$tag.txt" | head -24
}
prof pingpong cutlass_kernel_cudnn 2 --no-dbias
prof coop256 cutlass_kernel_cudnn 2 --no-dbias --variant t256c2m2k
prof grouped_mm device_kernel 1 --grouped-mm
