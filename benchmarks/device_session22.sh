#!/usr/bin/env bash
# Prepared in session 21, extended and run in session 22 (H200; results and the tree each
# part ran on: benchmarks/results/session22/README.md; part "cross2" was run with the split
# deep form through vbench instead, and "final" as part of "split2"):
#   source .gpu/env/setup.sh && bash benchmarks/device_session22.sh <part>
# Fresh machine: two calls first. Call 1 carries [".gpu/1", ".gpu/env"] and runs
# `source .gpu/env/setup.sh` (its tree plus what it carries must stay under 64 MiB: in
# session 21 two wheels moved from .gpu/1 to .gpu/2 for that). Call 2 carries [".gpu/2",
# ".gpu/env"] and runs `mkdir -p /tmp/stash && cp .gpu/2/*.whl /tmp/stash/; source
# .gpu/env/setup.sh && bash benchmarks/device_session22.sh PART`. Later calls on the warm
# machine carry nothing. The machine goes back after ~30 s idle: issue the next call at once.
# Part "cross2" (main, knob-only, round-robin in one process): the cooperative deep-K variant
#   (t256c4m2s3k) against the ping-pong default (t128c1m2h2) along K and N: dsv3's N at K
#   5120 and 6144 (session 21: the cooperative kernel tied and won 1.6%), and N 4096, 8192,
#   16384 at K 6144 and N 8192, 16384 at K 7168 (bench_dglu EXTRA_SHAPES). The engine picks
#   the cooperative kernel at K >= 7168 at any N; session 17 had it 8-13% slower at N 16384,
#   K 6144, before the epilogue got shorter. About 4 min.
# Part "split" (main, session 22): the cooperative kernel's last round split along K (knob
#   split_last): its GPU tests (split_cases, fresh outputs), racecheck, synccheck and memcheck
#   on sanitize_sm90.py split, then the deep-K cooperative variant without and with a 3-way
#   split, round-robin in one process, on dsv3, K 8192, K 12288 (1,024 units over 66
#   clusters: 34 left) and K 7168 at N 8192 (2,048 units: 2 left). About 6 min.
# Part "split2" (main, after the engine took split_last 3 for the deep-K form): the split
#   GPU tests again (the slot check's grid bound fixed), dsv3 traces without and with the
#   split (the last wave's end times), and the full benchmark. About 5 min.
# Part "split3" (main, after review): the pieces of the split last round go to the clusters
#   in contiguous shares (a final part waits only on lower clusters), the small split cases
#   carry rows past the last offset so that their grid splits: the split and heuristics GPU
#   tests (K 6152: the new cooperative threshold), the split sanitizer modes, and the A/B of
#   part split again. About 5 min.
# Part "split4" (main): split3's contiguous shares chained the final parts' waits across
#   clusters (dsv3 1.510 ms against 1.310 unsplit); now the pieces are right-aligned over
#   the clusters, non-final ones first, finals on the last clusters waiting only on lower
#   ones. The split GPU tests, racecheck and synccheck on it, and the A/B again. About 3 min.
# Part "gpu" (main): the whole GPU suite in 4 workers. About 4 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = cross2 ]; then
  coop_vs_pp cross2 k5k,k6kd,k6kn4,k6kn8,k6k,k7kn8,k7kn16
elif [ "$1" = split ]; then
  split_check split_last "racecheck synccheck memcheck"
elif [ "$1" = split4 ]; then
  split_check split_last "racecheck synccheck"
elif [ "$1" = split3 ]; then
  split_check "split_last or heuristics" "racecheck synccheck memcheck"
elif [ "$1" = split2 ]; then
  tp split_tests -m gpu tests/gpu/test_sm90_correctness.py -k split_last -n 4 -s
  grep -E "clusters, [0-9]+ units" "$OUT/split_tests.log" | head -12
  trace dsv3_x1 dsv3 --variant t256c4m2s3k
  trace dsv3_x3 dsv3 --variant t256c4m2s3kx3
  final_bench
else
  std_part "$1" "device_session22.sh cross2|split|split2|split3|split4|gpu|final"
fi
bundle "session22_$1"  # every log and JSON in one file (the tool returns at most 8)
