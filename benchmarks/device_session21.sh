#!/usr/bin/env bash
# Prepared in session 20 for the next device session (H200); not yet run:
#   source .gpu/env/setup.sh && bash benchmarks/device_session21.sh <part>
# Call plan (session 20's, ~30 min of device time on one machine): a fresh machine takes two
# calls first, `source .gpu/env/setup.sh` carrying [".gpu/1", ".gpu/env"], then the same
# carrying [".gpu/2", ".gpu/env"] (the first call's tree and what it carries are limited to
# 64 MiB together: no unpacked branch folders then). Branches run from an untracked folder
# of the checkout (`mkdir -p ab_X/ab_old && git archive BRANCH | tar -x -C ab_X && git
# archive main cudnn_ext | tar -x -C ab_X/ab_old`, drop ab_X/benchmarks/results and
# ab_X/docs; `cd ab_X && source ../.gpu/env/setup.sh && bash benchmarks/device_session21.sh
# PART`). The machine goes back after ~30 s idle: issue the next call at once.
# Part "sync" (main): synccheck on every sanitizer case, among them the 2-CTA cluster walks
#   whose ping-pong fold moved to mbarriers in session 20 (`cluster`, `discretecl`: GPU
#   tests since then, not yet run), the deep-K cooperative ring (`coop4`: 4 C stages per
#   warpgroup, the engine's choice since session 20; racecheck and synccheck GPU tests, not
#   yet run), the 2x2 cluster, N-major dense B and the fresh-outputs launch. About 2 min.
# Part "coopr" (main, knob-only): the cooperative deep-K kernel (4 C stages, 3 A/B stages
#   since session 20) with raster groups of 2 and 8 M-tiles against the default 4, on dsv3,
#   K 8192 and K 12288. Never timed for the cooperative kernel (4 was chosen on ping-pong:
#   results/NVIDIA_H200-2026-11-30-raster-stages.json). About 2 min.
# Part "gpu" (main): the whole GPU suite in 4 workers. About 5 min.
# Part "final" (main): the full benchmark for the README's table. About 2.5 min.
# Session 21 ran sync, gpu and coopr on main d0dfa57 (results/session21/), then:
# Part "ilp" (branch exp/epi-ilp; ab_old/ holding main d0dfa57's cudnn_ext): the epilogue
#   reads all gate/up pairs of a 64-row half-block before its math and D writes (the SASS had each
#   pair's load-to-store chain in order: the next pair's loads may alias this pair's D
#   writes). The whole GPU suite in 4 workers, dsv3, K 8192, K 12288 and the four shapes
#   against ab_old, and trace_one.py on dsv3 (cooperative) and qwen3 (ping-pong) for both
#   trees. About 9 min.
# Part "group" (branch exp/epi-group; ab_old/ holding main f74d663's cudnn_ext, the "ilp"
#   change merged): the cooperative epilogue takes its C blocks two at a time (both entry
#   waits, then all loads, all math, the releases and the dbias hand-overs), so that one
#   basic block holds two blocks' math. Ping-pong kernels are unchanged (PTX identical).
#   dsv3, K 8192 and K 12288 against ab_old and trace_one.py on dsv3 for both trees, then
#   (if asked: "group gpu") the whole GPU suite in 4 workers. About 3 min, 7 with the suite.
# Part "epi" (main 5728504): where the cooperative epilogue's 10.6 k cycles per tile go now:
#   trace_one.py on dsv3 with dbias, without it, and with dbias on half the CTAs (bound in
#   the SM, or by the chip?). About 1 min.
# Part "cross" (main e0d59be, knob-only, round-robin in one process): the cooperative
#   deep-K kernel (t256c4m2s3k) against the ping-pong default (t128c1m2h2) at dsv3's N
#   with K 5120, 6144 and 7168, now that the cooperative epilogue is 15% shorter (session
#   17: the cooperative kernel lost 1.7% at K 5120 with dbias and tied at 6144). About 1.5 min.
# Fresh machine, since session 21: .gpu/1 got too big next to the tree, so two of its wheels
#   (apache_tvm_ffi, nvidia_cutlass_dsl_libs_base) moved to .gpu/2 here; the second call
#   copies them into the stash first: `mkdir -p /tmp/stash && cp .gpu/2/*.whl /tmp/stash/;
#   source .gpu/env/setup.sh && ...`.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = sync ]; then
  for m in cluster discretecl coop4 cluster2x2 densen fresh dense discrete walk chalf coop; do
    san synccheck "$m"
  done
elif [ "$1" = coopr ]; then
  vbench coopr coopr t256c4m2s3k,t256c4m2s3r2k,t256c4m2s3r8k --shapes dsv3,k8k,k12k
  grep -E "^(k8k|k12k) " "$OUT/coopr.log"
elif [ "$1" = ilp ]; then
  need_ab_old
  need_branch exp/epi-ilp "loaded = \[self._load_gate_up"
  gpu_suite ilp_gpu
  ab_six
  for sv in dsv3:t256c4m2s3k qwen3:t128c1m2h2; do
    s=${sv%%:*}
    trace "new_$s" "$s" --variant "${sv##*:}"
    (export PYTHONPATH="$PWD/ab_old:$PYTHONPATH"; trace "old_$s" "$s" --variant "${sv##*:}")
    grep -h "epilogue" "$OUT/trace_new_$s.log" "$OUT/trace_old_$s.log"
  done
elif [ "$1" = group ]; then
  need_ab_old
  need_branch exp/epi-group "def epi_group"
  ab ab_old old --shapes dsv3,k8k,k12k
  ab ab_new new --shapes dsv3,k8k,k12k
  grep -hE "^(k8k|k12k) " "$OUT/ab_old.log" "$OUT/ab_new.log"
  trace new_dsv3 dsv3 --variant t256c4m2s3k
  (export PYTHONPATH="$PWD/ab_old:$PYTHONPATH"; trace old_dsv3 dsv3 --variant t256c4m2s3k)
  [ "$2" = gpu ] && gpu_suite group_gpu
elif [ "$1" = epi ]; then
  trace dbias dsv3 --variant t256c4m2s3k
  trace nodbias dsv3 --variant t256c4m2s3k --no-dbias
  trace half dsv3 --variant t256c4m2s3k --ctas 66
  grep -h "epilogue" "$OUT"/trace_*.log
elif [ "$1" = cross ]; then
  coop_vs_pp cross k5k,k6kd,dsv3
else
  std_part "$1" "device_session21.sh sync|coopr|gpu|ilp|group [gpu]|epi|cross|final"
fi
bundle "session21_$1"  # every log and JSON in one file (the tool returns at most 8)
