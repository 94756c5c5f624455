#!/usr/bin/env bash
# Device calls for the in-kernel dbias fold (arrival counters; one kernel with a zero-kept
# scratch). Part "tests": every dbias-summing kernel family (ping-pong 64/128, 2x1 and 2x2
# clusters, cooperative, N-major, discrete, fresh outputs, fp32 C/D), the torch replay on
# the zero-kept scratch, racecheck (dense, cooperative) and memcheck (dense). Part "bench":
# host overhead and the four shapes with dbias next to torch._grouped_mm.
#   source .gpu/env/setup.sh && bash benchmarks/device_dbias_fold.sh tests|bench
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = tests ]; then
  K='heuristics or fresh or (dbias1 and (M10240-N512 or M32768 or Cfp32-Dfp32 or (M768-N320 and coop)))'
  tp gpu_tests -m gpu tests/gpu/test_sm90_correctness.py tests/gpu/test_sm90_discrete.py -k "$K"
  tp torch_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py
  san racecheck dense
  san racecheck coop
  san memcheck dense
else
  t host python3 benchmarks/bench_host_overhead.py --device cuda --reps 500 --out "$OUT/host.json"
  grep -E "python_fn|zeros_only|wrapper" "$OUT/host.log"
  t bench python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm --reps 20 --warmup 3 --out "$OUT/bench.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
fi
