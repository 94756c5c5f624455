#!/usr/bin/env bash
# Prepared in session 11, run in session 12 on the lent H200 (2026-12-01): parts tests and
# bench from main at 5822fe2, verify from exp/early-handoff, final from main at f166ae9.
# Results: results/session12-c-split/, results/exp-early-handoff-session12/,
# results/NVIDIA_H200-2026-12-01-session12.json, results/logs/*session12*.
# Why: session 11's profile (qwen3, dbias) has our kernel and grouped_mm both at ~77% of L2
# throughput, ours for 1.34x longer. Per 64-deep k-tile a CTA of ours reads 24 KB from L2
# (A 16 KB, its half of the multicast B 8 KB) for 2.1 MFLOP of a 128 x 128 tile; CUTLASS's
# 128 x 256 cooperative tile in 2x1 clusters reads 32 KB for 4.2 MFLOP: 1.5x fewer bytes per
# FLOP, before our C and D traffic. 2x2 clusters (A multicast too: 16 KB per 2.1 MFLOP)
# match its ratio; they measured 2-8% slower than 2x1 when added and 3-5% in session 5,
# before the D stores, dbias sums and 6 A/B stages left the math warps' path. Low odds
# (session 5 found the shared-memory pipe busiest, which 2x2 does not relieve): a cheap
# check.
# Part "tests": the c-half GPU cases (now with 2x2 clusters and discrete weights), the 2x2
# cases, racecheck on the ring probe. Part "bench": the default (2x1, c_split 2 at K <=
# 2048) against 2x2 with and without c_split 2, and discrete weights with and without
# c_split 2 (the engine does not offer it there yet), with and without dbias, round-robin,
# two processes with dbias.
# Parts "verify", "final" and "profile" (written in session 12 after those two ran): see below.
#   source .gpu/env/setup.sh && bash benchmarks/device_session12.sh tests|bench|verify|final|profile
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = tests ]; then
  tp c_half_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half"
  tp cluster_2x2_tests -m gpu tests/gpu/test_sm90_correctness.py -k "cl2x2 and not c_half"
  probe ring ring1
elif [ "$1" = verify ]; then
  # from branch exp/early-handoff with ab_old/ = main (git archive main cudnn_ext | tar -x
  # -C ab_old): main's engine rule on the GPU (pytest from ab_old/, so its package imports
  # first), then main against the branch, alternating processes twice, then the branch's
  # heuristics and c-half cases
  need_ab_old
  (cd ab_old && python3 -c "import cudnn_ext; print('main tests import', cudnn_ext.__file__)")
  t heuristics_main bash -c "cd ab_old && python3 -m pytest -c ../pyproject.toml -m gpu \
    ../tests/gpu/test_sm90_correctness.py -k heuristics -q -p no:cacheprovider"
  grep -E "FAILED|Error" "$OUT/heuristics_main.log" | head -6
  for r in 1 2; do
    ab "ab_old_$r" old --shapes qwen3,skew,dsv3,mixtral
    ab "ab_new_$r" new --shapes qwen3,skew,dsv3,mixtral
  done
  tp branch_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics or c_half"
elif [ "$1" = final ]; then
  # main after the engine change: the full benchmark (two processes with dbias, one
  # without), the torch/JAX framework GPU tests and the demo
  for r in 1 2; do
    t "bench_$r" python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_$r.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench_$r.log"
    [ $r = 1 ] && tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py
    [ $r = 1 ] && t demo timeout 150 python3 -m cudnn_ext demo
  done
  t bench_nodb python3 benchmarks/bench_dglu.py --no-dbias --reps 30 --warmup 5 \
    --out "$OUT/bench_nodb.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench_nodb.log"
elif [ "$1" = profile ]; then
  # L2 and DRAM traffic measured (session 11's byte counts were arithmetic): ours (the
  # engine's choice, dbias) and grouped_mm on qwen3 and skew, ncu sections SpeedOfLight and
  # MemoryWorkloadAnalysis plus the L2 sector counts by operation
  M=lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_atom.sum
  M=$M,lts__t_sectors_op_red.sum,dram__bytes_read.sum,dram__bytes_write.sum
  M=$M,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed
  for shape in qwen3 skew; do for v in ours mm; do
    flag=""; [ $v = mm ] && flag="--grouped-mm"
    kn="regex:cutlass_kernel_cudnn"; [ $v = mm ] && kn="regex:device_kernel"
    timeout 150 ncu --clock-control none --kernel-name $kn --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics "$M" \
      python3 benchmarks/profile_one.py $shape $flag > "$OUT/l2_${shape}_$v.txt" 2>&1
    echo "== $shape $v rc=$?"
    grep -E "Duration|Elapsed Cycles|lts__t_sectors_op|dram__bytes|hit_rate|lts__throughput" \
      "$OUT/l2_${shape}_$v.txt" | head -12
  done; done
elif [ "$1" = bench ]; then
  V=t128c1m2,t128c1m2h2,t128c1m2n2,t128c1m2n2h2
  D=t128c1m2,t128c1m2h2
  for r in 1 2; do vbench "bench_db_$r" "cl2x2_db_$r" $V --discrete-variants $D; done
  vbench bench_nodb cl2x2_nodb $V --discrete-variants $D --no-dbias
fi
bundle "session12_$1"  # every log and JSON in one file (the tool returns at most 8)
