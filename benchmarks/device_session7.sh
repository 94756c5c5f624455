#!/usr/bin/env bash
# Session 7: D stores issued by the C producer warps (the math warps only fence and release
# each block). Part "tests": every kernel family's GPU cases with dbias, fresh outputs, the
# heuristics, N-major/discrete, the framework (torch replay, JAX) tests, racecheck and
# memcheck. Part "ab": the four shapes, default and cooperative with dbias, next to
# torch._grouped_mm, for the code before the change (ab_old/, an unpacked older commit,
# not tracked) and after, twice each, alternating processes on one machine.
# Part "coopdb": the cooperative schedule's dbias sums added in shared memory (one global
# atomic per column and tile): its GPU cases, racecheck/memcheck, then the four shapes with
# dbias, default and cooperative, twice.
# Part "final": the engine's own choice (now cooperative with dbias for K >= 4096) against the
# float64 reference, contract and fresh outputs, then the full benchmark.
# Part "producer": one k-tile loop for dense and discrete B in the A/B producer: discrete,
# cluster and N-major cases, racecheck on discrete B in clusters.
#   source .gpu/env/setup.sh && bash benchmarks/device_session7.sh tests|ab|coopdb|final|producer
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = tests ]; then
  K='heuristics or fresh or dbias1 or coop or M0-'
  tp gpu_tests -m gpu tests/gpu/test_sm90_correctness.py tests/gpu/test_sm90_discrete.py -k "$K" -x
  tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py tests/test_jax.py
  san racecheck dense
  san racecheck coop
  san racecheck densen
  san memcheck fresh
  san memcheck coop
elif [ "$1" = final ]; then
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  t bench python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
elif [ "$1" = producer ]; then
  tp producer_tests -m gpu tests/gpu/test_sm90_discrete.py tests/gpu/test_sm90_correctness.py -k "discrete or cluster or n_major"
  san racecheck discretecl
elif [ "$1" = coopdb ]; then
  tp coop_tests -m gpu tests/gpu/test_sm90_correctness.py -k "coop or heuristics or fresh"
  san racecheck coop
  san memcheck coop
  for r in 1 2; do
    t "coopdb_$r" python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
      --variants t256c2m2k --reps 20 --warmup 3 --out "$OUT/coopdb_$r.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/coopdb_$r.log"
  done
else
  for r in 1 2; do
    for v in old new; do
      pp=$PYTHONPATH; [ $v = old ] && pp="$PWD/ab_old:$PYTHONPATH"
      env PYTHONPATH="$pp" python3 -c "import cudnn_ext; print('$v:', cudnn_ext.__file__)"
      t "ab_${v}_$r" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py \
        --impls cudnn_ext,torch_grouped_mm --variants t256c2m2k --reps 20 --warmup 3 \
        --out "$OUT/ab_${v}_$r.json"
      grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/ab_${v}_$r.log"
    done
  done
fi
