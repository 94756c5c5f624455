#!/usr/bin/env bash
# Session 8: where the cooperative epilogue's time goes, and the trimmed epilogue.
# Part "profile": ncu warp-stall sampling per SASS instruction (SourceCounters) of the
# cooperative 128x256 kernel without and with dbias and of the default ping-pong kernel with
# dbias, qwen3; each report is printed as a per-instruction CSV (source page) for offline
# attribution to mainloop / epilogue / waits. Then the cooperative kernel with and without
# dbias next to torch._grouped_mm (two processes: bench_dglu's dbias switch is per process).
# Part "tests": the kernel's GPU cases (every schedule; dbias now added by global atomics in
# the cooperative schedule and signalled a tile late in both; the dSwiGLU math with beta
# pulled out, new signed-beta cases); "tests2": the framework GPU tests, racecheck, memcheck.
# Part "ab": the four shapes with dbias, default / cooperative / ping-pong, for c1fefff
# (ab_old/), 831a953 (ab_mid/: the dbias change alone) and the working tree, alternating
# processes twice; then without dbias, old and new once. Part "ab2": c1fefff against the
# working tree, cooperative and ping-pong with dbias. Part "revert": after d126b9d (the
# cooperative dbias sums back in shared memory), its GPU cases, sanitizers, framework tests
# and c1fefff against it once more. ab_old/ and ab_mid/ are unpacked commits
# (git archive REV cudnn_ext | tar -x -C ab_old): untracked, never ignored, never committed.
# Part "final": the engine's own choice against the float64 reference, then the full
# benchmark and the demo (not run in session 8: the device time ran out).
#   source .gpu/env/setup.sh && bash benchmarks/device_session8.sh profile|tests|tests2|ab|ab2|revert|final
set -o pipefail
source "$(dirname "$0")/device_common.sh"
SRC_SECTIONS="--section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats"
srcprof() { local tag=$1; shift
  timeout 200 ncu --clock-control none --kernel-name regex:cutlass_kernel_cudnn --launch-skip 2 \
    --launch-count 1 $SRC_SECTIONS -f -o "$OUT/src_$tag" python3 benchmarks/profile_one.py qwen3 "$@" \
    > "$OUT/src_$tag.log" 2>&1
  echo "== $tag rc=$?"
  ncu -i "$OUT/src_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$tag.csv" 2> "$OUT/src_$tag.err"
  ncu -i "$OUT/src_$tag.ncu-rep" --page details > "$OUT/src_$tag.txt" 2>&1
  grep -E "Duration|Issued Warp|No Eligible|Warp Cycles Per Issued" "$OUT/src_$tag.txt" | head -6
  wc -l "$OUT/src_$tag.csv"; head -c 300 "$OUT/src_$tag.err"
}
if [ "$1" = profile ]; then
  srcprof coop_nodb --no-dbias --variant t256c2m2k
  srcprof coop_db --variant t256c2m2k
  srcprof pp_db --variant t128c1m2
  for db in dbias nodbias; do
    flag=""; [ $db = nodbias ] && flag="--no-dbias"
    t "coop_$db" python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm \
      --variants t256c2m2k,t128c1m2 $flag --reps 20 --warmup 3 --out "$OUT/coop_$db.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/coop_$db.log"
  done
fi
if [ "$1" = tests ]; then
  tp gpu_tests -m gpu tests/gpu/test_sm90_correctness.py -k "not M0-"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
elif [ "$1" = tests2 ]; then
  tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py
  san racecheck coop
  san racecheck dense
  san memcheck coop
  san memcheck fresh
elif [ "$1" = ab ]; then
  # (run in session 8 with ab_old/ and ab_mid/ listed in .git/info/exclude and a python -c
  # import check from the repo root, which always finds the working tree: which copy each
  # process ran is not verified; see results/ab-session8-three-way/)
  for d in ab_old ab_mid; do
    [ -d $d/cudnn_ext ] || { echo "$d/ missing: it must be untracked, not ignored, to travel"; exit 1; }
  done
  for r in 1 2; do
    for v in old mid new; do
      pp=$PYTHONPATH; [ $v != new ] && pp="$PWD/ab_$v:$PYTHONPATH"
      (cd benchmarks && env PYTHONPATH="$pp" python3 -c "import sys; sys.path.insert(0, '.'); import cudnn_ext; print('$v:', cudnn_ext.__file__)")
      t "ab_${v}_$r" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py \
        --impls cudnn_ext,torch_grouped_mm --variants t256c2m2k,t128c1m2 --reps 20 --warmup 3 \
        --out "$OUT/ab_${v}_$r.json"
      grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/ab_${v}_$r.log" | grep cudnn
    done
  done
  for v in old new; do
    pp=$PYTHONPATH; [ $v != new ] && pp="$PWD/ab_$v:$PYTHONPATH"
    t "ab_nodbias_$v" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py --no-dbias \
      --impls cudnn_ext,torch_grouped_mm --variants t256c2m2k,t128c1m2 --reps 20 --warmup 3 \
      --out "$OUT/ab_nodbias_$v.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/ab_nodbias_$v.log" | grep cudnn
  done
elif [ "$1" = ab2 ]; then
  # old (ab_old/: c1fefff) against the working tree, with dbias, alternating processes
  [ -d ab_old/cudnn_ext ] || { echo "ab_old/ missing: it must be untracked, not ignored, to travel"; exit 1; }
  for r in 1 2; do
    for v in old new; do
      pp=$PYTHONPATH; [ $v = old ] && pp="$PWD/ab_old:$PYTHONPATH"
      (cd benchmarks && env PYTHONPATH="$pp" python3 -c "import sys; sys.path.insert(0, '.'); import cudnn_ext; print('$v:', cudnn_ext.__file__)")
      t "ab2_${v}_$r" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py --shapes qwen3,skew,dsv3 \
        --impls cudnn_ext --variants t256c2m2k,t128c1m2 --reps 20 --warmup 3 --out "$OUT/ab2_${v}_$r.json"
      grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/ab2_${v}_$r.log" | grep "\\["
    done
  done
elif [ "$1" = revert ]; then
  # cooperative dbias back to shared-memory sums (ab2 measured the global atomics slower),
  # with the deferred fold signal and the trimmed math: its GPU cases, the torch framework
  # tests, racecheck, then old against new once more (what ran in session 8, as one command)
  [ -d ab_old/cudnn_ext ] || { echo "ab_old/ missing: it must be untracked, not ignored, to travel"; exit 1; }
  tp coop_tests -m gpu tests/gpu/test_sm90_correctness.py -k "coop or heuristics or fresh or sbeta" &&
    tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py
  san racecheck coop
  for v in old new; do
    pp=$PYTHONPATH; [ $v = old ] && pp="$PWD/ab_old:$PYTHONPATH"
    t "ab3_$v" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py --shapes qwen3,skew \
      --impls cudnn_ext --variants t256c2m2k --reps 20 --warmup 3 --out "$OUT/ab3_$v.json"
    grep -E "^(qwen3|skew) " "$OUT/ab3_$v.log"
  done
elif [ "$1" = final ]; then
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  t bench python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/bench.log"
  t demo python3 -m cudnn_ext demo
fi
