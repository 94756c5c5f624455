#!/usr/bin/env bash
# Session 10 device runs (H200), branch exp/pp-dbias-producer: in the ping-pong schedule
# the C producer warps add the dbias column sums (per C stage, 2 KB of shared memory instead
# of 8) and signal the folder; the 1 KB margin gives ping-pong 128 a sixth A/B stage.
# Part "tests": every kernel GPU case, the discrete dbias cases, racecheck and memcheck on
# the small cluster case and on a walk of several tiles per warpgroup.
# Part "ab": main (ab_old/, an unpacked copy: git archive main cudnn_ext | tar -x -C ab_old,
# untracked, never committed) against the working tree, the engine's choice with dbias,
# round-robin timing, alternating processes twice; then without dbias once each.
# Part "final" (the final version: every math thread arrives on the C stage's empty barrier,
# the C producer reads the slice before its full-barrier arrive): racecheck on walk and
# cluster, memcheck on walk, then main against it with dbias, alternating twice. In session
# 10 these commands ran inline in one device call (same commands, same order), followed by
# part "tests" without the sanitizers, the framework GPU tests and the demo.
# Part "probe" (not run in session 10: written after the device time ran out): racecheck on
# tests/gpu/racecheck_probe.py, a 64-thread shared-memory hand-off synchronized by nothing
# (a true race), a named barrier, or an mbarrier; it tells whether the hazards racecheck
# reports on the dbias slice are the tool's (mbar reported like none) or real.
#   source .gpu/env/setup.sh && bash benchmarks/device_session10.sh tests|ab|final|probe
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = tests ]; then
  tp kernel_tests -m gpu tests/gpu/test_sm90_correctness.py -k "not M0-"
  tp discrete_tests -m gpu tests/gpu/test_sm90_discrete.py -k "dbias1"
  for m in cluster walk; do san racecheck $m; san memcheck $m; done
elif [ "$1" = probe ]; then
  probe none bar mbar
else
  need_ab_old
  if [ "$1" = ab ]; then
    for r in 1 2; do for v in old new; do ab "db_${v}_$r" $v; done; done
    for v in old new; do ab "nodb_$v" $v --no-dbias; done
  elif [ "$1" = final ]; then
    san racecheck walk; san racecheck cluster; san memcheck walk
    for r in 1 2; do for v in old new; do ab "all_${v}_$r" $v; done; done
  fi
fi
bundle "session10_$1"  # every log and JSON in one file (the tool returns at most 8)
