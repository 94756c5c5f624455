#!/usr/bin/env bash
# One device call: GPU correctness tests for the SM90 engine, then the benchmark.
# Run on the lent H200 from the project root after ../shared/gpu/README.md's install calls:
#   source .gpu/env/setup.sh && bash benchmarks/device_check.sh [bench args...]
# SANITIZE=1 also runs compute-sanitizer memcheck and racecheck on one small case.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -m pytest -m gpu tests/gpu -q -x -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -4
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool python3 tests/gpu/sanitize_sm90.py > "$OUT/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$OUT/sanitize_$tool.log" | tail -2)"
  done
fi
python3 benchmarks/bench_dglu.py --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -22
