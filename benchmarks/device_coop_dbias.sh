#!/usr/bin/env bash
# Device call for branch wip/coop-dbias-atomics: the cooperative schedule without a
# shared-memory dbias stage (warps add finished column sums to the workspace directly, so
# 128 x 256 tiles keep 4 A/B stages with 2 C stages). Cooperative GPU cases (dbias on and
# off), the heuristics test, racecheck on the cooperative kernel, then dbias-on timings of
# the cooperative variant next to the ping-pong default and torch._grouped_mm.
#   source .gpu/env/setup.sh && bash benchmarks/device_coop_dbias.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
t coop_tests python3 -m pytest -m gpu tests/gpu/test_sm90_correctness.py -k "cooperative or heuristics" -q -p no:cacheprovider
grep -E "FAILED|Error" "$OUT/coop_tests.log" | head -6
t racecheck timeout 120 compute-sanitizer --report-api-errors no --tool racecheck python3 tests/gpu/sanitize_sm90.py coop
grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1
t bench python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm --variants t256c2m2k \
  --reps 20 --warmup 3 --out "$OUT/bench.json"
grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
