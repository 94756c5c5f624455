#!/usr/bin/env bash
# Prepared in session 13 for the next device session (H200); not yet run.
# Why: session 13's ncu run had our ping-pong kernel at grouped_mm's SM cycles on dsv3 but
# a 10% lower clock, and the cooperative 128 x 256 kernel at grouped_mm's L2 traffic and a
# higher clock with 15% more cycles (results/session13/pipes/). At the 700 W cap a call's
# time follows its energy, so part "energy" measures energy per call with NVML's counter
# (sustained.py's nvml_mj_per_call, new in session 13, never run on a GPU yet) next to
# nvidia-smi's power x time: grouped_mm, the engine's ping-pong default (t128c1m2h2) and the
# cooperative kernel (t256c2m2k), each in 3 s stretches, two passes, rows rotated; with dbias
# on the four benchmark shapes and without dbias on dsv3 (where the cooperative kernel was
# 3% faster under device time). About 3 minutes.
#   source .gpu/env/setup.sh && bash benchmarks/device_session14.sh energy
# Part "race" (session 14): compute-sanitizer racecheck on the kernel's walks after dad3cea
# (the C producer's slice reads ordered by a one-warp named barrier instead of a warp sync
# that ptxas had lowered to a NOP; sessions 10-12 reported 4 hazards on walk, chalf and
# cluster), memcheck on the walk, then the GPU cases that run that hand-off (64-row C
# entries, per-expert weights with dbias, the heuristics' choices with dbias).
# Part "probe" (session 14): where the epilogue's time goes. Branch exp/epi-probe (unpacked
# untracked into exp_pkg/) adds a diagnostic knob (variant suffix p1-p3; wrong results by
# design): p1 trivial epilogue math (no MUFU), p2 also no C traffic, p3 also no D stores.
# The engine's ping-pong default (t128c1m2h2) and the cooperative kernel (t256c2m2k), each
# with its probes, next to grouped_mm, on qwen3 and dsv3 with dbias, round-robin.
# Part "race" found the hazards unchanged (the named barrier did not help); part "race2"
# runs the same after the next change: every lane of the C producer warp arrives on the C
# full barrier (count 32, lane 0 with the bytes), the pattern of racecheck_probe.py's
# wartx32, which racecheck reported clean in session 11.
# Part "probe2": probes 4 (no C L2 prefetch, correct results) and 5 (no C TMA loads, the
# prefetch kept) on the four shapes, then main (ab new) against 18683a8 (ab_old/, ab old).
#   source .gpu/env/setup.sh && bash benchmarks/device_session14.sh race|probe|race2|probe2|nopf|final|energy|cring
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = race ]; then
  for m in walk chalf cluster discretecl coop; do san racecheck $m; done
  san memcheck walk
  tp c_half_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half"
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
elif [ "$1" = race2 ]; then
  for m in walk chalf cluster discretecl; do san racecheck $m; done
  san memcheck chalf
  tp c_half_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half"
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
elif [ "$1" = probe2 ]; then
  [ -d exp_pkg/cudnn_ext ] || { echo "exp_pkg/ missing"; exit 1; }
  need_ab_old
  t probe2 env PYTHONPATH="$PWD/exp_pkg:$PYTHONPATH" python3 exp_pkg/benchmarks/bench_dglu.py \
    --impls cudnn_ext,torch_grouped_mm --variants t128c1m2h2,t128c1m2h2p4,t128c1m2h2p5 \
    --rounds 5 --reps 30 --warmup 5 --out "$OUT/probe2.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/probe2.log"
  ab ab_old_1 old; ab ab_new_1 new
elif [ "$1" = nopf ]; then
  # the A/B producer's C L2 prefetch removed (working tree) against 762e649 (ab_old/), two
  # alternating process pairs, each with the cooperative kernel as a variant; then the
  # heuristics' GPU cases on the new build
  need_ab_old
  for i in 1 2; do
    ab "nopf_old_$i" old --variants t256c2m2k; ab "nopf_new_$i" new --variants t256c2m2k
  done
  tp heur_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics"
elif [ "$1" = final ]; then
  # energy per call (part energy) and the full benchmark on the final main
  t bench_final python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_final.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead|timer" "$OUT/bench_final.log"
elif [ "$1" = cring ]; then
  # after the prefetch removal: the engine's default (1 C stage, 64-row entries, 6 A/B
  # stages) against 2 C stages (4 A/B stages) and 128-row entries, one process, 4 shapes
  vbench cring cring t128c1m2h2,t128c2m2h2,t128c1m2 --rounds 5 --reps 30
elif [ "$1" = probe ]; then
  [ -d exp_pkg/cudnn_ext ] || { echo "exp_pkg/ missing"; exit 1; }
  (cd /tmp && env PYTHONPATH="$OLDPWD/exp_pkg:$PYTHONPATH" python3 -c \
    "import cudnn_ext; print('probe package:', cudnn_ext.__file__)")
  V=t128c1m2h2,t128c1m2h2p1,t128c1m2h2p2,t128c1m2h2p3,t256c2m2k,t256c2m2kp1,t256c2m2kp3
  t probe env PYTHONPATH="$PWD/exp_pkg:$PYTHONPATH" python3 exp_pkg/benchmarks/bench_dglu.py \
    --impls cudnn_ext,torch_grouped_mm --variants $V --shapes qwen3,dsv3 --rounds 5 --reps 30 \
    --warmup 5 --out "$OUT/probe.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/probe.log"
elif [ "$1" = energy ]; then
  for shape in dsv3 mixtral qwen3 skew; do
    t "energy_$shape" python3 benchmarks/sustained.py $shape --out "$OUT/energy_$shape.json"
    grep -E "pass|NVML" "$OUT/energy_$shape.log"
  done
  t energy_dsv3_nodb python3 benchmarks/sustained.py dsv3 --no-dbias --out "$OUT/energy_dsv3_nodb.json"
  grep -E "pass|NVML" "$OUT/energy_dsv3_nodb.log"
fi
bundle "session14_$1"  # every log and JSON in one file (the tool returns at most 8)
