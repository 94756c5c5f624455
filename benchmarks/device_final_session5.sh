#!/usr/bin/env bash
# One device call (session 5): the framework GPU tests and the demo on the engine's new
# default choices, the host-overhead benchmark, then a dbias-on variant sweep of the fixed
# mainloop (2x2 clusters, cooperative, 2 C stages) next to the default and torch._grouped_mm.
#   source .gpu/env/setup.sh && bash benchmarks/device_final_session5.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
t framework_tests python3 -m pytest -m gpu tests/test_torch_integration.py tests/test_api.py tests/test_plan.py \
  tests/test_jax.py -q -p no:cacheprovider -rs
t coop_tests python3 -m pytest -m gpu tests/gpu/test_sm90_correctness.py -k cooperative -q -p no:cacheprovider
t demo python3 -m cudnn_ext demo
grep -iE "engine|ms|knob" "$OUT/demo.log" | head -6
t host_overhead python3 benchmarks/bench_host_overhead.py --device cuda --reps 500 --out "$OUT/host_overhead.json"
grep -E "python_fn_out|custom_op_out" "$OUT/host_overhead.log"
t sweep python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
  --variants t128c1m2n2,t256c2m2k,t256c2m2n2k,t128c2m2 --reps 20 --warmup 3 --out "$OUT/sweep.json"
grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/sweep.log"
