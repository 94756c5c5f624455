#!/usr/bin/env bash
# One device call: every GPU test of the project (with the JAX XLA FFI path on),
# compute-sanitizer memcheck/racecheck on the dense, discrete, 2-CTA-cluster and 2x2-cluster
# kernels (SANITIZE_MODES), and the host-overhead benchmark. Run on the lent H200 after ../shared/gpu/README.md's install calls:
#   source .gpu/env/setup.sh && bash benchmarks/device_verify.sh
# Logs and JSON go to $OUT; what it prints is a short summary.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
export CUDNN_EXT_JAX_FFI=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t gpu_tests python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rs
t framework_tests python3 -m pytest -m gpu tests/test_jax_ffi.py tests/test_torch_integration.py \
  tests/test_jax.py tests/test_plan.py tests/test_api.py -q -p no:cacheprovider -rs
for mode in ${SANITIZE_MODES:-dense discrete cluster cluster2x2 coop}; do
  for tool in memcheck racecheck; do
    t "sanitize_${tool}_$mode" timeout 150 compute-sanitizer --report-api-errors no --tool $tool python3 tests/gpu/sanitize_sm90.py $mode
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${tool}_$mode.log" | tail -1
  done
done
t host_overhead python3 benchmarks/bench_host_overhead.py --device cuda --reps 500 --out "$OUT/host_overhead.json"
grep -E "us|µs" "$OUT/host_overhead.log" | tail -8
