#!/usr/bin/env bash
# One device call: the dbias reduce-scatter (every dbias-summing kernel family: ping-pong
# tile 64/128, 2x1 and 2x2 clusters, cooperative, N-major, discrete, fresh outputs, fp32 C/D),
# the heuristics' cooperative choice without dbias, racecheck on the dense kernel, and the
# four benchmark shapes with dbias next to torch._grouped_mm.
#   source .gpu/env/setup.sh && bash benchmarks/device_dbias_rs.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
K='heuristics or (dbias1 and (M10240-N512 or M32768 or Cfp32-Dfp32 or (M768-N320 and coop)))'
t gpu_tests python3 -m pytest -m gpu tests/gpu/test_sm90_correctness.py tests/gpu/test_sm90_discrete.py \
  -k "$K" -q -p no:cacheprovider
grep -E "FAILED|Error" "$OUT/gpu_tests.log" | head -6
t racecheck timeout 120 compute-sanitizer --report-api-errors no --tool racecheck python3 tests/gpu/sanitize_sm90.py dense
grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1
t bench python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm --reps 20 --warmup 3 --out "$OUT/bench.json"
grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
t bench_nodbias python3 benchmarks/bench_dglu.py --impls cudnn_ext --variants t128c1m2 --no-dbias --reps 20 --warmup 3 --out "$OUT/bench_nodbias.json"
grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench_nodbias.log"
