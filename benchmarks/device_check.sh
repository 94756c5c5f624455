#!/usr/bin/env bash
# One device call: GPU correctness tests for the SM90 engine, then the benchmark.
# Run on the lent H200 from the project root after ../shared/gpu/README.md's install calls:
#   source .gpu/env/setup.sh && bash benchmarks/device_check.sh [bench args...]
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -m pytest -m gpu tests/gpu -q -x -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -25
python3 benchmarks/bench_dglu.py --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -30
