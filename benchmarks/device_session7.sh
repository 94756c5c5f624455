#!/usr/bin/env bash
# Session 7: D stores issued by the C producer warps (the math warps only fence and release
# each block). Part "tests": every kernel family's GPU cases with dbias, fresh outputs, the
# heuristics, N-major/discrete, the framework (torch replay, JAX) tests, racecheck and
# memcheck. Part "ab": the four shapes, default and cooperative with dbias, next to
# torch._grouped_mm, for the code before the change (ab_old/, an unpacked older commit,
# not tracked) and after, twice each, alternating processes on one machine.
#   source .gpu/env/setup.sh && bash benchmarks/device_session7.sh tests|ab
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
