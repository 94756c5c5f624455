#!/usr/bin/env bash
# Device call for the eager hot path's guarded replay (cudnn_ext.torch._core.run_fast):
# the framework GPU tests (the replay against the float64 oracle with the real kernel,
# CUDA-graph capture, the MLP), then the host-overhead benchmark and the breakdown.
#   source .gpu/env/setup.sh && bash benchmarks/device_session6.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
t framework_tests python3 -m pytest -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py \
  tests/test_jax_ffi.py tests/test_jax.py tests/test_plan.py tests/test_api.py -q -p no:cacheprovider
grep -E "FAILED|Error" "$OUT/framework_tests.log" | head -8
t host python3 benchmarks/bench_host_overhead.py --device cuda --reps 500 --out "$OUT/host.json"
grep -E "python_fn|zeros_only|wrapper" "$OUT/host.log"
t breakdown python3 benchmarks/host_path_breakdown.py
cat "$OUT/breakdown.log"
