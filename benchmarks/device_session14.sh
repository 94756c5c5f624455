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
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = energy ]; then
  for shape in dsv3 mixtral qwen3 skew; do
    t "energy_$shape" python3 benchmarks/sustained.py $shape --out "$OUT/energy_$shape.json"
    grep -E "pass|NVML" "$OUT/energy_$shape.log"
  done
  t energy_dsv3_nodb python3 benchmarks/sustained.py dsv3 --no-dbias --out "$OUT/energy_dsv3_nodb.json"
  grep -E "pass|NVML" "$OUT/energy_dsv3_nodb.log"
fi
bundle "session14_$1"  # every log and JSON in one file (the tool returns at most 8)
