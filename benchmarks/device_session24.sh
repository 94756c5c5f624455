#!/usr/bin/env bash
# Session 24 (H200):  source .gpu/env/setup.sh && bash benchmarks/device_session24.sh <part>
# Fresh machine: two calls first. Call 1 carries [".gpu/1", ".gpu/env"] and runs
# `source .gpu/env/setup.sh`; call 2 carries [".gpu/2", ".gpu/env"] and runs `mkdir -p
# /tmp/stash && cp .gpu/2/*.whl /tmp/stash/; source .gpu/env/setup.sh && bash
# benchmarks/device_session24.sh PART`. Later calls on the warm machine carry nothing but
# must source the setup script again. The machine goes back after ~30 s idle.
# Part "sk2" (session 23's review fixes to the stream-K last round, af309fe, never run on a
#   GPU): the split GPU tests with the not-spread case, racecheck and synccheck on split.
# Part "cross3" (the cooperative threshold's untimed corners): the split deep form
#   (t256c4m2s3kx3) against the ping-pong default (t128c1m2h2), round-robin in one process,
#   dense at K 5120 (N 2048) and N 12288 (K 6144, 7168); per-expert weights (the discrete
#   forms, t128c1m2h2 with 64-row C entries there) at K 5120 and 6144 (N 2048), where the
#   engine keeps them on ping-pong (K < 7168), and K 7168 (dsv3) as the control.
# Part "cross4" (main, after the deep form went to K >= 5120 for both weight modes): the
#   heuristics GPU tests (K 5128 dense and per-expert: cooperative), then the same A/B at
#   K 5120 with N 4096 and 8192, and at K 4096 (N 2048, below the new bound), dense and
#   per-expert weights.
# Part "short" (main): the cooperative forms on the short-K benchmark shapes with dbias,
#   last timed there in session 9 (a tie on qwen3), before the epilogue trims and the deep
#   form: t256c4m2s3kx3 and t256c2m2k against the ping-pong default t128c1m2h2 on qwen3
#   (K 2048) and skew (K 4096), round-robin in one process.
# Part "mid" (main, after dense weights took the 2-stage cooperative form at K 4096-5119
#   and N <= 1024, from part short and the ad hoc short2/short3 runs): the heuristics GPU
#   tests (K 4104 now cooperative), the full benchmark, and per-expert weights on skew:
#   the 2-stage cooperative form against their ping-pong form (t128c1m2, 128-row C).
# Part "gpu" (main): the whole GPU suite in 4 workers. About 5.5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = sk2 ]; then
  tp split_tests -m gpu tests/gpu/test_sm90_correctness.py -k split_last -n 4 -s
  san racecheck split; san synccheck split
elif [ "$1" = cross3 ]; then
  vbench cross3_dense cross3_dense t256c4m2s3kx3,t128c1m2h2 --shapes k5k,k6kn12,k7kn12
  grep -E "^k[0-9]" "$OUT/cross3_dense.log"
  t cross3_discrete python3 benchmarks/bench_dglu.py --impls torch_grouped_mm \
    --discrete-variants t256c4m2s3kx3,t128c1m2h2 --rounds 10 --reps 60 --warmup 5 \
    --shapes k5k,k6kd,dsv3 --out "$OUT/cross3_discrete.json"
  grep -E "^(dsv3|k[0-9])" "$OUT/cross3_discrete.log"
elif [ "$1" = cross4 ]; then
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k heuristics -n 4
  grep -E "passed|failed" "$OUT/heur_tests.log" | tail -1
  vbench cross4_dense cross4_dense t256c4m2s3kx3,t128c1m2h2 --shapes k5kn4,k5kn8,k4k
  grep -E "^k[0-9]" "$OUT/cross4_dense.log"
  t cross4_discrete python3 benchmarks/bench_dglu.py --impls torch_grouped_mm \
    --discrete-variants t256c4m2s3kx3,t128c1m2h2 --rounds 10 --reps 60 --warmup 5 \
    --shapes k4k,k5kn8 --out "$OUT/cross4_discrete.json"
  grep -E "^k[0-9]" "$OUT/cross4_discrete.log"
elif [ "$1" = short ]; then
  vbench short short t256c4m2s3kx3,t256c2m2k,t128c1m2h2 --shapes qwen3,skew
elif [ "$1" = mid ]; then
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k heuristics -n 4
  grep -E "passed|failed" "$OUT/heur_tests.log" | tail -1
  final_bench
  t mid_discrete python3 benchmarks/bench_dglu.py --impls torch_grouped_mm \
    --discrete-variants t256c2m2k,t128c1m2 --rounds 10 --reps 60 --warmup 5 \
    --shapes skew --out "$OUT/mid_discrete.json"
  grep -E "^skew" "$OUT/mid_discrete.log"
else
  std_part "$1" "device_session24.sh sk2|cross3|cross4|short|mid|gpu|final"
fi
bundle "session24_$1"  # every log and JSON in one file (the tool returns at most 8)
