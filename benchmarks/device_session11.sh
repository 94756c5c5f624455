#!/usr/bin/env bash
# Session 11 device runs (H200). Parts "decide" and "tests" ran from branch exp/c-half at
# 7566d5b with ab_old/ = main at 486b957 (git archive main cudnn_ext | tar -x -C ab_old;
# untracked, never committed); part "final" from main after the merge.
# Part "decide": racecheck on the mbarrier probe (none/bar/mbar), the c-half GPU cases, main
# against the branch's default (ab, alternating processes twice, with dbias), then the
# default against t128c1m2h2 and t128c2m2h2 with dbias (round-robin, one process) and
# without dbias (one process).
# Part "tests": every other kernel GPU case and the discrete dbias cases on this tree, then
# racecheck and memcheck on the c-half walk and the walk.
# Part "final": the full benchmark
# (every peer: grouped_mm, the compiled unfused path, quack), the engine's heuristics cases,
# the torch/JAX GPU tests, the demo, and racecheck on
# the probe's single-arrive modes (mbar1, war1, war32: see tests/gpu/racecheck_probe.py).
# Part "extra": racecheck on the probe's bulk-copy modes (wartx, wartx32: the kernel's full
# barrier, whose phase a bulk copy completes), a second process of the full benchmark with
# dbias and one without, and an ncu source-level profile (warp stalls per SASS instruction)
# of the engine's qwen3 kernel with dbias (c_split 2) next to grouped_mm's.
# Part "prefetch" (branch exp/ab-prefetch, ab_old/ = main): main against the branch (an L2
# prefetch of the A/B k-tiles ab_stages ahead of the loads), dbias, alternating twice, with
# the heuristics GPU cases (on the branch) between the pairs; in session 11 these commands
# ran inline in one device call, in this order (results/exp-ab-prefetch-session11/).
# Part "ring" (written after the device time ran out; not run in session 11): racecheck on
# the probe's ring modes (ring, ring1: the kernel's whole dbias slice hand-off, 4 writer
# warps and a reader warp over 8 rounds), which tells whether the 4 hazards racecheck reports
# on the kernel come from the pattern itself.
#   source .gpu/env/setup.sh && bash benchmarks/device_session11.sh decide|tests|final|extra|prefetch|ring
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = decide ]; then
  need_ab_old
  probe none bar mbar
  tp c_half_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half"
  for r in 1 2; do for v in old new; do ab "ab_${v}_$r" $v; done; done
  V=t128c1m2,t128c1m2h2,t128c2m2h2
  vbench bench_db chalf_db $V
  vbench bench_nodb chalf_nodb $V --no-dbias
elif [ "$1" = tests ]; then
  tp kernel_tests -m gpu tests/gpu/test_sm90_correctness.py -k "not M0- and not c_half"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
  for m in chalf walk; do san racecheck $m; san memcheck $m; done
elif [ "$1" = final ]; then
  t bench python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench.log"
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py
  t demo timeout 150 python3 -m cudnn_ext demo
  probe mbar1 war1 war32
elif [ "$1" = extra ]; then
  probe wartx wartx32
  t bench2 python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench2.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench2.log"
  t bench_nodb python3 benchmarks/bench_dglu.py --no-dbias --reps 30 --warmup 5 \
    --out "$OUT/bench_nodb.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead" "$OUT/bench_nodb.log"
  for v in ours mm; do
    flag=""; [ $v = mm ] && flag="--grouped-mm"
    kn="regex:cutlass_kernel_cudnn"; [ $v = mm ] && kn="regex:device_kernel"
    timeout 200 ncu --clock-control none --kernel-name $kn --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section SpeedOfLight \
      --section SchedulerStats -f -o "$OUT/src_$v" python3 benchmarks/profile_one.py qwen3 $flag \
      > "$OUT/src_$v.log" 2>&1
    echo "== ncu $v rc=$?"
    ncu -i "$OUT/src_$v.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$v.csv" 2>&1
    ncu -i "$OUT/src_$v.ncu-rep" --page details > "$OUT/src_$v.txt" 2>&1
    grep -E "Duration|Elapsed Cycles|Issued Warp|No Eligible" "$OUT/src_$v.txt" | head -5
  done
elif [ "$1" = ring ]; then
  probe ring ring1
elif [ "$1" = prefetch ]; then
  need_ab_old
  ab pf_old_1 old; ab pf_new_1 new
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  ab pf_old_2 old; ab pf_new_2 new
fi
bundle "session11_$1"  # every log and JSON in one file (the tool returns at most 8)
