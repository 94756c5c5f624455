#!/usr/bin/env bash
# One device call: the full benchmark (every peer, dbias on: the command), then the
# cudnn_ext rows without dbias next to the cooperative variants and torch._grouped_mm.
#   source .gpu/env/setup.sh && bash benchmarks/device_bench_session5.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_final.json" > "$OUT/bench_final.log" 2>&1
echo "[bench_final rc=$?]"; grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench_final.log"
python3 benchmarks/bench_dglu.py --impls cudnn_ext,cudnn_ext_discrete,torch_grouped_mm --variants t256c2m2k,t192c2m2k \
  --no-dbias --reps 20 --warmup 3 --out "$OUT/bench_nodbias.json" > "$OUT/bench_nodbias.log" 2>&1
echo "[bench_nodbias rc=$?]"; grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench_nodbias.log"
