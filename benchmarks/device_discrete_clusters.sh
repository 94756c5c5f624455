#!/usr/bin/env bash
# One device call: discrete weights (b_ptrs) in 2x1 clusters -- the discrete GPU tests,
# compute-sanitizer memcheck/racecheck on the 2x1 discrete kernel, and discrete 1x1 vs 2x1
# side by side with the dense default and torch._grouped_mm. On the lent H200:
#   source .gpu/env/setup.sh && bash benchmarks/device_discrete_clusters.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t discrete_tests python3 -m pytest -m gpu tests/gpu/test_sm90_discrete.py -q -p no:cacheprovider -rs
grep -E "FAILED|Error" "$OUT/discrete_tests.log" | head -8
for tool in memcheck racecheck; do
  t "sanitize_${tool}_discretecl" timeout 150 compute-sanitizer --report-api-errors no --tool $tool python3 tests/gpu/sanitize_sm90.py discretecl
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_discretecl.log" | tail -1
done
t bench python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
  --discrete-variants t128c1,t128c1m2 --reps 20 --warmup 3 --out "$OUT/bench_discrete_clusters.json"
grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
