#!/usr/bin/env bash
# Prepared in session 16 for the next device session (H200); run in session 17 (results/
# session17/README.md: sanitize and jaxcoop from fd8beda; verify, crossover and final after
# the phantom-block change, a97037c). All parts from main:
#   source .gpu/env/setup.sh && bash benchmarks/device_session17.sh <part>
# Part "sanitize": compute-sanitizer on the cooperative kernel with dbias (tests/gpu/
#   sanitize_sm90.py coop), whose folder warp now flushes the shared column sums between two
#   named barriers (session 16): racecheck, synccheck (barrier use), memcheck. About 2 min.
# Part "jaxcoop": the JAX FFI GPU tests, among them the cooperative kernel with dbias forced
#   (fold_dbias=False: the math warps flush, JAX rounds). cudnn_ext/jax/ffi.py choose_knobs
#   leaves the cooperative kernel out with dbias until that passes on a GPU. About 2 min.
# Part "crossover": cooperative 128 x 256 (t256c2m2k) against ping-pong (t128c1m2h2) on
#   dsv3-like shapes with K 5120 and 6144 (bench_dglu EXTRA_SHAPES k5k, k6kd) next to dsv3
#   and k6k, with and without dbias: where _COOP_MIN_DEEP_K (7168) belongs. Session 16
#   measured the cooperative kernel 0.2% slower to 2.9% faster at K 7168, 2-8% faster at
#   8192 and 12288, and 6.8% slower on k6k (K 6144, N 16384). About 4 min.
# Part "final": the full benchmark (every shape, every peer) for the README's table (session
#   16 re-measured dsv3 only). About 5 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = sanitize ]; then
  san racecheck coop
  san synccheck coop
  san memcheck coop
elif [ "$1" = verify ]; then
  # after the phantom-block change (the cooperative epilogue skips dbias blocks past 2N; the
  # flush leaves their sums alone): racecheck three times (its hazard came in 2 of 3 runs
  # before), synccheck, then the cooperative and heuristics GPU cases and the JAX FFI tests
  for i in 1 2 3; do
    t "racecheck_coop$i" timeout 120 compute-sanitizer --report-api-errors no --tool racecheck \
      python3 tests/gpu/sanitize_sm90.py coop
    grep -E 'SUMMARY' "$OUT/racecheck_coop$i.log" | tail -1
  done
  san synccheck coop
  tp coop_tests -m gpu tests/gpu/test_sm90_correctness.py -k "cooperative or heuristics"
  tp jax_tests -m gpu tests/test_jax_ffi.py
elif [ "$1" = jaxcoop ]; then
  tp jax_tests -m gpu tests/test_jax_ffi.py
elif [ "$1" = crossover ]; then
  for db in "" --no-dbias; do
    t "cross${db:+_nodb}" python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
      --variants t128c1m2h2,t256c2m2k --shapes k5k,k6kd,dsv3,k6k --rounds 6 --reps 30 \
      --warmup 5 $db --out "$OUT/cross${db:+_nodb}.json"
    grep -E "^(k5k|k6kd|dsv3|k6k) " "$OUT/cross${db:+_nodb}.log"
  done
elif [ "$1" = final ]; then
  final_bench
else
  echo "usage: device_session17.sh sanitize|verify|jaxcoop|crossover|final"; exit 2
fi
bundle "session17_$1"  # every log and JSON in one file (the tool returns at most 8)
