#!/usr/bin/env bash
# Final device call of session 6, after the dbias fold moved to a folder warp (and the
# grid-stride zero fills became one helper): every dbias-summing kernel family and the
# fresh-outputs cases, the torch replay (zero-kept scratch) and the JAX GPU tests (the JAX
# path runs the kernel without the in-kernel fold), racecheck on the dense and cooperative
# kernels, memcheck on the fresh-outputs launch, the demo and the host overhead.
#   source .gpu/env/setup.sh && bash benchmarks/device_final_session6.sh
set -o pipefail
source "$(dirname "$0")/device_common.sh"
K='heuristics or fresh or (dbias1 and (M10240-N512 or M32768 or Cfp32-Dfp32 or (M768-N320 and coop)))'
tp gpu_tests -m gpu tests/gpu/test_sm90_correctness.py tests/gpu/test_sm90_discrete.py -k "$K"
tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py tests/test_jax.py
san racecheck dense
san racecheck coop
san memcheck fresh
t demo python3 -m cudnn_ext demo
tail -3 "$OUT/demo.log"
t host python3 benchmarks/bench_host_overhead.py --device cuda --reps 500 --out "$OUT/host.json"
grep -E "python_fn|zeros_only|wrapper" "$OUT/host.log"
