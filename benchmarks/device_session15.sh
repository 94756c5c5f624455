#!/usr/bin/env bash
# Prepared in session 14 (parts l2, mainloop, sanitizers, desc); run in session 15 on lent
# H200s with parts attrib, stages, trace and cpf added there (results under
# benchmarks/results/session15/<part>/; docs/kernel_sessions.md "Session 15"). Parts trace
# and cpf ran with their branch checked out (exp/trace, exp/c-l2-prefetch); unpacking all
# three branches at once pushed the tree past the device tool's 64 MiB with .gpu/1
# (unpack only cudnn_ext, tests and the benchmark scripts, not benchmarks/results).
# Why: session 14's probes (docs/kernel_sessions.md, "Session 14") put most of the epilogue's cost in
# reading C (its DRAM traffic more than its loads), and session 12's ncu run had our kernel
# read 263 MB from DRAM on qwen3 where A, B and C hold 217 MB (grouped_mm: 168 of 167): the
# (M, 2N) C and D streams pass through the 50 MB L2 and can push out the A/B k-tiles that
# other CTAs re-read.
# Part "l2": branch exp/l2-hints, unpacked untracked into exp_l2/
#   (mkdir exp_l2 && git archive exp/l2-hints cudnn_ext benchmarks tests | tar -x -C exp_l2):
#   L2 eviction hints on the TMA traffic (variant suffix e<mask>: 1 C loads evict-first,
#   2 D stores evict-first, 4 A/B loads evict-last), ping-pong default and cooperative,
#   four shapes, two processes, round-robin; then ncu DRAM bytes and L2 sectors on qwen3
#   for the default and e7. About 7 minutes.
# Part "mainloop": branch exp/epi-probe2 (main after session 14 plus the probes), unpacked
#   into exp_probe/ the same way: ncu of probe p3 (no C loads, no D stores, no activation
#   math; wrong results by design) and of the kernel, next to grouped_mm, on qwen3 and dsv3 (SM cycles, clock, L2 sectors, shared wavefronts, warp
#   stalls): what the 5-6% between our ping-pong mainloop and grouped_mm's is. About 4 minutes.
# Part "sanitizers": tests/gpu/test_sm90_sanitizers.py (new in session 14, not yet run):
#   racecheck on walk, chalf, cluster, discretecl, coop and memcheck on walk, chalf through
#   pytest, so that a hazard fails a test from now on; then racecheck_probe.py's ring modes
#   (ringtma, ringtma32: new, the kernel's tensor-TMA full barrier with one or 32 arrivals;
#   ring as the control). About 4 minutes.
# Part "desc": branch exp/desc-once, unpacked into exp_desc/ the same way (discrete weights:
#   the descriptor acquire fence only when the tile's expert changes, not every tile): its
#   discrete GPU cases, then the discrete rows of main and of the branch in two alternating
#   process pairs. About 5 minutes.
#   source .gpu/env/setup.sh && bash benchmarks/device_session15.sh l2|mainloop|sanitizers|desc
set -o pipefail
source "$(dirname "$0")/device_common.sh"
# (metrics that sessions 12-13's ncu runs on the H200 accepted)
# pkg DIR NAME ARGS...: t NAME, running DIR's bench_dglu.py with DIR's package first
pkg() { local d=$1 name=$2; shift 2
  [ -d "$d/cudnn_ext" ] || { echo "$d/ missing"; exit 1; }
  (cd /tmp && env PYTHONPATH="$OLDPWD/$d:$PYTHONPATH" python3 -c \
    "import cudnn_ext; print('$d package:', cudnn_ext.__file__)")
  t "$name" env PYTHONPATH="$PWD/$d:$PYTHONPATH" python3 "$d/benchmarks/bench_dglu.py" \
    --impls cudnn_ext,torch_grouped_mm "$@" --out "$OUT/$name.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/$name.log"; }
M=lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,dram__bytes_read.sum
M=$M,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__cycles_active.avg
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
# prof DIR NAME SHAPE ARGS...: ncu one launch of DIR's profile_one.py SHAPE ARGS
prof() { local d=$1 name=$2 shape=$3; shift 3; local kn=regex:cutlass_kernel_cudnn
  [ "$1" = --grouped-mm ] && kn=regex:device_kernel
  timeout 200 env PYTHONPATH="$PWD/$d:$PYTHONPATH" ncu --clock-control none --kernel-name "$kn" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --metrics "$M" python3 "$d/benchmarks/profile_one.py" "$shape" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$?"
  grep -E "Duration|Elapsed Cycles|SM Frequency|dram__bytes_read|lts__t_sectors_op_read|lts__t_sector_hit" \
    "$OUT/$name.txt" | head -7; }
if [ "$1" = l2 ]; then
  V=t128c1m2h2,t128c1m2h2e1,t128c1m2h2e3,t128c1m2h2e7,t256c2m2k,t256c2m2ke3
  pkg exp_l2 l2_1 --variants $V --rounds 5 --reps 30 --warmup 5
  pkg exp_l2 l2_2 --variants $V --rounds 5 --reps 30 --warmup 5
  prof exp_l2 ncu_qwen3_e0 qwen3 --variant t128c1m2h2
  prof exp_l2 ncu_qwen3_e7 qwen3 --variant t128c1m2h2e7
elif [ "$1" = desc ]; then
  [ -d exp_desc/cudnn_ext ] || { echo "exp_desc/ missing"; exit 1; }
  t desc_tests env PYTHONPATH="$PWD/exp_desc:$PYTHONPATH" python3 -m pytest -m gpu -q \
    -p no:cacheprovider exp_desc/tests/gpu/test_sm90_discrete.py
  for i in 1 2; do
    t "desc_main_$i" python3 benchmarks/bench_dglu.py --impls cudnn_ext_discrete,torch_grouped_mm \
      --rounds 10 --reps 60 --warmup 5 --out "$OUT/desc_main_$i.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/desc_main_$i.log"
    pkg exp_desc "desc_branch_$i" --impls cudnn_ext_discrete,torch_grouped_mm --rounds 10 \
      --reps 60 --warmup 5
  done
elif [ "$1" = sanitizers ]; then
  tp sanitizer_tests -m gpu tests/gpu/test_sm90_sanitizers.py -v
  probe ring ringtma ringtma32
elif [ "$1" = attrib ]; then
  # (added in session 15 after part mainloop) p3 (no C, no D, no math) took the same
  # cycles as grouped_mm but ran at a lower clock: split the clock gap between L2 reads
  # (2x2 clusters: grouped_mm's L2 bytes per MMA, our shared-memory bytes) and shared-memory
  # reads (cooperative 128 x 256: grouped_mm's L2 and shared-memory bytes per MMA).
  M=$M,smsp__inst_executed.sum
  for s in dsv3 qwen3; do
    prof exp_probe "ncu_${s}_coop_p3" $s --variant t256c2m2kp3
    prof exp_probe "ncu_${s}_2x2_p3" $s --variant t128c1m2n2p3
  done
  prof exp_probe ncu_dsv3_pp_p3i dsv3 --variant t128c1m2h2p3  # with the instruction count
  prof exp_probe ncu_dsv3_mm_i dsv3 --grouped-mm
elif [ "$1" = stages ]; then
  # (added in session 15) what an A/B stage is worth: the cooperative kernel with 3 stages
  # (the only count that leaves room for the structural route's 64 KB of parked
  # accumulators, docs/kernels.md "What is left") and ping-pong with 5 and 4 (what a
  # deeper C ring would cost it); this tree's package, one process, round-robin.
  vbench stages stages t256c2m2k,t256c2m2s3k,t256c1m2s3k,t128c1m2s5h2,t128c1m2s4h2 --rounds 8 --reps 40
elif [ "$1" = trace ]; then
  # (added in session 15, run from branch exp/trace checked out) per-tile timelines of the
  # math warpgroups (benchmarks/trace_one.py): ping-pong on the four shapes, cooperative on
  # dsv3 and qwen3, ping-pong without dbias on qwen3
  for s in qwen3 dsv3 skew mixtral; do
    t "trace_$s" python3 benchmarks/trace_one.py $s --json "$OUT/trace_$s.json"
    tail -1 "$OUT/trace_$s.log"; done
  for s in qwen3 dsv3; do
    t "trace_${s}_coop" python3 benchmarks/trace_one.py $s --variant t256c2m2k \
      --json "$OUT/trace_${s}_coop.json"
    tail -1 "$OUT/trace_${s}_coop.log"; done
  t trace_qwen3_nodb python3 benchmarks/trace_one.py qwen3 --no-dbias --json "$OUT/trace_qwen3_nodb.json"
  tail -1 "$OUT/trace_qwen3_nodb.log"
elif [ "$1" = cpf ]; then
  # (added in session 15, run from branch exp/c-l2-prefetch checked out) the C producer's
  # TMA L2 prefetch of a tile's remaining C entries: f1 when the epilogue starts, f2 one
  # ring-full earlier; one process, round-robin; then its GPU cases
  vbench cpf cpf t128c1m2h2,t128c1m2h2f1,t128c1m2h2f2 --rounds 6 --reps 40
  tp cpf_tests -m gpu tests/gpu/test_sm90_c_prefetch.py
elif [ "$1" = mainloop ]; then
  for s in qwen3 dsv3; do
    prof exp_probe "ncu_${s}_p3" $s --variant t128c1m2h2p3
    prof exp_probe "ncu_${s}_p0" $s --variant t128c1m2h2
    prof exp_probe "ncu_${s}_mm" $s --grouped-mm
  done
fi
bundle "session15_$1"  # every log and JSON in one file (the tool returns at most 8)
