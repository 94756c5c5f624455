#!/usr/bin/env bash
# Session 9 device runs (H200).
# Part "sustained": every benchmark shape, with dbias, torch._grouped_mm and the ping-pong
# 128 and cooperative 128x256 kernels, each run back to back for 3 s (two passes) while
# nvidia-smi samples clock and power (benchmarks/sustained.py).
# Part "final": after the heuristics change (cooperative only without dbias at K <= 2048),
# the engine's own choice against the float64 reference, the torch and JAX GPU tests, the
# full benchmark (round-robin timing) and the demo.
# Part "sweep": ping-pong knob variants with dbias, timed round-robin, one process.
#   source .gpu/env/setup.sh && bash benchmarks/device_session9.sh sustained|final|sweep
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = sustained ]; then
  for s in dsv3 qwen3 mixtral skew; do
    t "sustained_$s" python3 benchmarks/sustained.py "$s" --out "$OUT/sustained_$s.json"
    grep -E "pass" "$OUT/sustained_$s.log"
  done
elif [ "$1" = final ]; then
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py
  t bench python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
  t demo python3 -m cudnn_ext demo
elif [ "$1" = sweep ]; then
  t sweep python3 benchmarks/bench_dglu.py --shapes qwen3,skew,dsv3 --impls cudnn_ext,torch_grouped_mm \
    --variants t128c1m2n2,t128c1m2r8,t128c1m2r2,t128c1m2r1,t64c1m2,t128c1,t96c1m2,t128c2m2n2 \
    --rounds 10 --reps 60 --warmup 5 --out "$OUT/sweep.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/sweep.log"
fi
