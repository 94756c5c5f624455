#!/usr/bin/env bash
# Prepared in session 16 for the next device session (H200); not yet run. All parts from main:
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
  t bench_final python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_final.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead|timer" "$OUT/bench_final.log"
else
  echo "usage: device_session17.sh sanitize|jaxcoop|crossover|final"; exit 2
fi
bundle "session17_$1"  # every log and JSON in one file (the tool returns at most 8)
