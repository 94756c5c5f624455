#!/usr/bin/env bash
# Prepared in session 15 for the next device session (H200); not yet run.
# Why (docs/kernel_sessions.md "Session 15"): session 15's per-tile trace found the ping-pong
# epilogue about 1.7x slower while the other warpgroup's mainloop runs (19-21 k SM cycles on
# every shape) than alone (10.5-12 k, each CTA's last tile). On qwen3 that is as long as a
# mainloop (~20 k), so no mainloop runs for ~6 k cycles per CTA and each CTA's last epilogue
# (~12 k) is exposed: ~13% of qwen3's span. What in the epilogue slows down next to the
# mainloop (its shared-memory traffic against the WGMMA operand reads, or issue) decides
# what could shorten it.
# Part "trace" (main): the trace knob's workspace form (new in session 15, CPU-tested only):
#   tests/gpu/test_sm90_trace.py, then trace_one.py on qwen3 and dsv3 (session 15's branch
#   form measured qwen3's epilogue at ~20.8 k cycles next to a mainloop, ~12.0 k alone).
#   About 2 minutes.
# Part "traceprobe": branch exp/trace-probe checked out (main after session 15 plus
#   exp/epi-probe2's probe knob): trace_one.py on qwen3 and dsv3 for the kernel and probes
#   p1 (no activation math), p2 (+ no C loads), p3 (+ no D stores): each probe's steady and
#   alone epilogue. Probe results are wrong by design. About 3 minutes.
# Part "cpf2": branch exp/c-l2-prefetch checked out: two more processes of the kernel
#   against its c_prefetch 1 variant (session 15's one process: -0.5% on qwen3, within 0.5%
#   elsewhere; f2 slower everywhere). About 4 minutes.
# Part "coop2x2" (main): the cooperative 128 x 256 kernel in 2x2 clusters (A multicast too:
#   fewer L2 bytes per MMA than grouped_mm, but 120 CTAs) next to its 2x1 form and the
#   default: does the lower L2 traffic buy the cooperative kernel a higher clock than the
#   idle SMs cost? One process, round-robin. About 2 minutes.
# Part "pp64": branch exp/pp64 checked out (knob pp_rows 64, variant suffix w64: ping-pong
#   warpgroup tiles of 64 x 256, one WGMMA 64 x 256 per k-step: 17% fewer shared-memory
#   operand reads per MMA than 128 x 128, the same L2 bytes; 4 A/B stages of 40 KB with 2 C
#   entries of 64 rows per warpgroup, 5 with 1): its 7 GPU cases, one process against the
#   default, and its timeline on qwen3 (does the epilogue contend less?). About 5 minutes.
#   git checkout <branch> && source .gpu/env/setup.sh && bash benchmarks/device_session16.sh <part>
# (The branches carry this script once main is merged into them; session 15 did that.)
# Added and run during session 16 (each part's comment below says its branch): cregs
# (exp/c-regs), kaxis, coopk and final (main), coopprobe (exp/trace-probe), coopfold
# (exp/coop-fold); benchmarks/results/session16/README.md lists the commits.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = trace ]; then
  tp trace_tests -m gpu tests/gpu/test_sm90_trace.py
  for s in qwen3 dsv3; do
    t "trace_$s" python3 benchmarks/trace_one.py $s --json "$OUT/trace_$s.json.gz"
  done
elif [ "$1" = traceprobe ]; then
  [ -f benchmarks/trace_one.py ] || { echo "check out exp/trace-probe first"; exit 1; }
  for s in qwen3 dsv3; do
    for p in "" p1 p2 p3; do
      t "trace_${s}_p${p:-0}" python3 benchmarks/trace_one.py $s --variant "t128c1m2h2$p" \
        --json "$OUT/trace_${s}_p${p:-0}.json.gz"
    done
  done
elif [ "$1" = coop2x2 ]; then
  vbench coop2x2 coop2x2 t256c2m2k,t256c2m2n2k --rounds 6 --reps 40
elif [ "$1" = pp64 ]; then
  [ -f tests/gpu/test_sm90_pp64.py ] || { echo "check out exp/pp64 first"; exit 1; }
  tp pp64_tests -m gpu tests/gpu/test_sm90_pp64.py
  vbench pp64 pp64 t256c2m2w64,t256c1m2w64 --rounds 6 --reps 40
  t trace_qwen3_pp64 python3 benchmarks/trace_one.py qwen3 --variant t256c2m2w64 \
    --json "$OUT/trace_qwen3_pp64.json.gz"
elif [ "$1" = cpf2 ]; then
  for i in 1 2; do vbench "cpf2_$i" "cpf2_$i" t128c1m2h2,t128c1m2h2f1; done
  tp cpf2_tests -m gpu tests/gpu/test_sm90_c_prefetch.py
elif [ "$1" = kaxis ]; then
  # (main, session 16) ping-pong (the engine's choice) against cooperative 128 x 256 along
  # K: dsv3 (K 7168) and bench_dglu's EXTRA_SHAPES k6k, k8k, k12k; one process, round-robin
  t kaxis python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
    --variants t256c2m2k --shapes dsv3,k6k,k8k,k12k --rounds 6 --reps 30 --warmup 5 \
    --out "$OUT/kaxis.json"
  grep -E "^(dsv3|k6k|k8k|k12k) " "$OUT/kaxis.log"
elif [ "$1" = coopk ]; then
  # (main, session 16, after the heuristics change: cooperative at K >= 7168) the engine's
  # choice against ping-pong (t128c1m2h2) with and without dbias, and the heuristics tests
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k heuristics
  for db in "" --no-dbias; do
    t "coopk${db:+_nodb}" python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
      --variants t128c1m2h2 --shapes dsv3,k6k,k8k,k12k --rounds 6 --reps 30 --warmup 5 $db \
      --out "$OUT/coopk${db:+_nodb}.json"
    grep -E "^(dsv3|k6k|k8k|k12k) " "$OUT/coopk${db:+_nodb}.log"
  done
elif [ "$1" = final ]; then
  # (main, session 16) the full benchmark on dsv3, the one issue shape whose engine choice
  # the session changed (cooperative at K >= 7168); every peer
  t bench_final python3 benchmarks/bench_dglu.py --shapes dsv3 --reps 30 --warmup 5 \
    --out "$OUT/bench_final.json"
  grep -E "^dsv3 |host overhead|timer" "$OUT/bench_final.log"
elif [ "$1" = coopprobe ]; then
  # (branch exp/trace-probe, commit bf9294c) the cooperative kernel's exposed epilogue on
  # dsv3, by part: the kernel, probes p1-p3 (wrong results by design), the kernel without dbias
  [ -f benchmarks/trace_one.py ] && grep -q probe cudnn_ext/engines/sm90.py \
    || { echo "check out exp/trace-probe first"; exit 1; }
  for p in "" p1 p2 p3; do
    t "trace_dsv3_k${p:-p0}" python3 benchmarks/trace_one.py dsv3 --variant "t256c2m2k$p" \
      --json "$OUT/trace_dsv3_k${p:-p0}.json.gz"
  done
  t trace_dsv3_k_nodb python3 benchmarks/trace_one.py dsv3 --variant t256c2m2k --no-dbias \
    --json "$OUT/trace_dsv3_k_nodb.json.gz"
elif [ "$1" = coopfold ]; then
  # branch exp/coop-fold: the folder warp flushes the cooperative dbias sums (suffix x)
  [ -f tests/gpu/test_sm90_fold_flush.py ] || { echo "check out exp/coop-fold first"; exit 1; }
  tp fold_tests -m gpu tests/gpu/test_sm90_fold_flush.py
  t coopfold python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
    --variants t256c2m2k,t256c2m2kx --shapes dsv3,k8k,k12k --rounds 6 --reps 30 --warmup 5 \
    --out "$OUT/coopfold.json"
  grep -E "^(dsv3|k8k|k12k) " "$OUT/coopfold.log"
  t trace_dsv3_kx python3 benchmarks/trace_one.py dsv3 --variant t256c2m2kx \
    --json "$OUT/trace_dsv3_kx.json.gz"
else
  echo "usage: device_session16.sh" \
    "trace|traceprobe|coop2x2|pp64|cpf2|kaxis|coopk|final|coopprobe|coopfold"; exit 2
fi
bundle "session16_$1"  # every log and JSON in one file (the tool returns at most 8)
