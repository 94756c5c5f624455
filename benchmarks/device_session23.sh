#!/usr/bin/env bash
# Prepared in session 22 for the next device session (H200); session 23 ran verify, final
# and gpu on main (01363c3 / eff44b0), then sk on the stream-K last round:
#   source .gpu/env/setup.sh && bash benchmarks/device_session23.sh <part>
# Fresh machine: two calls first. Call 1 carries [".gpu/1", ".gpu/env"] and runs
# `source .gpu/env/setup.sh`; call 2 carries [".gpu/2", ".gpu/env"] and runs `mkdir -p
# /tmp/stash && cp .gpu/2/*.whl /tmp/stash/; source .gpu/env/setup.sh && bash
# benchmarks/device_session23.sh PART`. Later calls on the warm machine carry nothing but
# must source the setup script again. The machine goes back after ~30 s idle.
# Part "verify" (main): what session 22 could not run on the merged split schedule
#   (d6290f8: the shared formulas): the split and heuristics GPU tests (the engine's K
#   6152 choice), racecheck, synccheck and memcheck on sanitize_sm90.py split, and the
#   unsplit/split A/B. About 5 min.
# Part "sk" (session 23's stream-K last round): the same checks as verify on it, then a
#   trace of dsv3 with it (trace_one.py).
# Part "sk2" (after review: the spread rule on the busiest range, the item glue in
#   tile_walk, a not-spread case): the split GPU tests, racecheck and synccheck on split.
#   Not run in session 23 (no device time left): the next session's first call. ~3 min.
# Part "gpu" (main): the whole GPU suite in 4 workers. About 5.5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = sk2 ]; then
  tp split_tests -m gpu tests/gpu/test_sm90_correctness.py -k split_last -n 4 -s
  san racecheck split; san synccheck split
elif [ "$1" = verify ] || [ "$1" = sk ]; then
  split_check "split_last or heuristics" "racecheck synccheck memcheck"
  [ "$1" = sk ] && trace dsv3_sk dsv3 --variant t256c4m2s3kx3
else
  std_part "$1" "device_session23.sh verify|sk|sk2|gpu|final"
fi
bundle "session23_$1"  # every log and JSON in one file (the tool returns at most 8)
