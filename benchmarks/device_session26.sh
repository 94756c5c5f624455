#!/usr/bin/env bash
# Session 26's device parts (H200):
#   source .gpu/env/setup.sh && bash benchmarks/device_session26.sh <part>
# Fresh machine: two calls first. Call 1 carries [".gpu/1", ".gpu/env"] and runs
# `source .gpu/env/setup.sh`; call 2 carries [".gpu/2", ".gpu/env"] and runs `mkdir -p
# /tmp/stash && cp .gpu/2/*.whl /tmp/stash/; source .gpu/env/setup.sh && bash
# benchmarks/device_session26.sh PART` (after ../shared/gpu/pack.sh, move the apache_tvm_ffi,
# pydantic_core and torch_c_dlpack_ext wheels from .gpu/1 to .gpu/2: .gpu/1 and the tree
# together pass the 64 MiB carry limit otherwise). Later calls on the warm machine carry
# nothing but must source the setup script again. The machine goes back after ~30 s idle.
# Part "dual" (main): can 2x2 clusters fill all 132 SMs? benchmarks/dual_cluster.py: the
#   problem's slabs split between a 2x2-cluster launch (every cluster of 4 that fits) and a
#   2x1-cluster launch on the 12 SMs left, on two streams at once, against the 2x1 and 2x2
#   kernels on the whole problem, each part alone, the engine's choice and grouped_mm;
#   round-robin in one process, dbias, on qwen3, skew, mixtral, dsv3. About 3 min.
# Part "dual2" (main): dual's question with P2 placed after P1: P2 2x1 (t128c1m2h2) or without
#   clusters (t128c1h2) on 12 CTAs, each with and without a 20 us spin on P2's stream
#   before it (part dual ran P1 and P2 only partly side by side), at the middle split.
#   About 2 min.
# Part "dualtr" (main): why dual2's launches overlap only in part: one traced dual launch
#   per shape (qwen3, mixtral) and P2 form, the CTAs' start and end times. About 1 min.
# Part "tr2x2" (main): the CTAs' end-time spread of the 2x2 kernel alone (t128c1m2n2h2)
#   against the 2x1 default (t128c1m2h2), traces of qwen3, skew and mixtral (is dualtr's
#   spread of P1's ends the 2x2 static schedule's own?). About 2 min.
# Part "energy" (main): energy per call at the power cap (sustained.py: 2 s stretches, 2
#   passes, NVML's energy counter) of grouped_mm, the engine's choice, quack and the 2x2
#   kernel, on the four shapes. About 3 min.
# Part "gpu" (main): the whole GPU suite in 4 workers (session 25's input-handling fixes
#   had not run on a GPU). About 5.5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = dual ]; then
  t dual python3 benchmarks/dual_cluster.py --shapes qwen3,skew,mixtral,dsv3 --out "$OUT/dual.json"
  sed -n '/^shape /,$p' "$OUT/dual.log"
elif [ "$1" = dual2 ]; then
  t dual2 python3 benchmarks/dual_cluster.py --shapes qwen3,skew,mixtral,dsv3 --splits mid \
    --p2 t128c1m2h2:12:0,t128c1m2h2:12:20,t128c1h2:12:0,t128c1h2:12:20 --out "$OUT/dual2.json"
  sed -n '/^shape /,$p' "$OUT/dual2.log"
elif [ "$1" = dualtr ]; then
  t dualtr python3 benchmarks/dual_cluster.py --trace --shapes qwen3,mixtral \
    --p2 t128c1m2h2:12:0,t128c1h2:12:20 --out "$OUT/dualtr.json"
  grep -E "CTAs start" "$OUT/dualtr.log"
elif [ "$1" = tr2x2 ]; then
  for shape in qwen3 skew mixtral; do
    for v in t128c1m2n2h2 t128c1m2h2; do trace "${shape}_$v" "$shape" --variant "$v"; done
  done
elif [ "$1" = energy ]; then
  for shape in dsv3 qwen3 mixtral skew; do
    t "energy_$shape" python3 benchmarks/sustained.py $shape --seconds 2 --passes 2 \
      --variants engine,quack,t128c1m2n2h2 --out "$OUT/energy_$shape.json"
    grep -E "pass" "$OUT/energy_$shape.log"
  done
else
  std_part "$1" "device_session26.sh dual|dual2|dualtr|tr2x2|energy|gpu|final"
fi
bundle "session26_$1"  # every log and JSON in one file (the tool returns at most 8)
