#!/usr/bin/env bash
# EXPERIMENT (branch exp/c-half): ping-pong C ring entries of 64 rows (knob c_split 2; bench
# variant infix h2, e.g. t128c1m2h2). Each C block is loaded, computed, released and stored
# in two row halves, so one half's D store, dbias hand-back and C reload overlap the other
# half's math (session 10's profile: 40% of the epilogue's samples wait for C blocks).
# Part "tests": the c-half GPU cases, the default kernel's cases (the epilogue and the C
# producer were restructured around ring entries), racecheck and memcheck on the c-half walk.
# Part "bench": with dbias, the default (t128c1m2) against t128c1m2h2 and t128c2m2h2 (two C
# blocks per warpgroup in four 8 KB entries; 4 A/B stages), round-robin, two processes; then
# without dbias once. Part "ab": main (ab_old/: git archive main cudnn_ext | tar -x -C ab_old,
# untracked, never committed) against this branch, the engine's default choice with dbias
# (the branch's C producer also hands back with compile-time entry indices at c_split 1:
# 5344 -> 5048 SASS instructions on qwen3), alternating processes twice.
#   source .gpu/env/setup.sh && bash benchmarks/device_c_half.sh tests|bench|ab
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = tests ]; then
  tp c_half_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half"
  tp kernel_tests -m gpu tests/gpu/test_sm90_correctness.py -k "not M0- and not c_half"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
  san racecheck chalf
  san memcheck chalf
elif [ "$1" = ab ]; then
  need_ab_old
  for r in 1 2; do for v in old new; do ab "ab_${v}_$r" $v; done; done
else
  V=t128c1m2,t128c1m2h2,t128c2m2h2
  for r in 1 2; do vbench "bench_$r" "chalf_$r" $V; done
  vbench bench_nodbias chalf_nodbias $V --no-dbias
fi
bundle "c_half_$1"  # every log and JSON in one file (the tool returns at most 8)
