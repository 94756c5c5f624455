#!/usr/bin/env bash
# Prepared in session 19 for the next device session (H200); not yet run:
#   source .gpu/env/setup.sh && bash benchmarks/device_session20.sh <part>
# Call plan that worked in session 19 (one machine, ~25 min of device time): unpack each
# branch into an untracked folder of the checkout (`mkdir -p ab_X/ab_old && git archive
# BRANCH | tar -x -C ab_X && git archive main cudnn_ext | tar -x -C ab_X/ab_old`, then drop
# ab_X/benchmarks/results and ab_X/docs), and run a part from there with `cd ab_X && source
# ../.gpu/env/setup.sh && bash benchmarks/device_session20.sh PART`, so that no checkout is
# needed between calls (the machine goes back after ~30 s idle). The first call (carrying
# .gpu/1) must not have the ab_X folders in the tree: the working tree's copy and what is
# carried are limited to 64 MiB together (move them aside for that call). Order (the
# merge candidates first; about 30 min in all, so the last may wait a session): sync (main),
# trim (exp/epi-trim), dstage2 (exp/d-stage), coopc (main), ringprobe (exp/probe19), then
# final (main after any merge).
# Part "coopc" (main): does a deeper C ring shorten the cooperative epilogue? Session 19's
#   probes (results/session19/epiprobe/) split the dsv3 cooperative epilogue, 13.6 k cycles
#   per tile, into the activation math 3.0 k, the C loads 2.5 k, the D stores ~0.1 k and
#   7.9 k that is none of these (smem reads and writes, sums, and the waits of the 2-entry
#   C ring per warpgroup and of the dbias slot). With 3 A/B stages instead of 4 the ring can
#   hold 3 or 4 entries (t256c3m2s3k, t256c4m2s3k; both compile here). Session 15 measured 3
#   A/B stages with 2 C entries (t256c2m2s3k) 0.7% slower on dsv3. First the three variants
#   timed round-robin with the default on dsv3, K 8192 and K 12288, then their traces on
#   dsv3 (epilogue and mainloop cycles per tile). About 3 min.
# Part "ringprobe" (branch exp/probe19: session 16's diagnostic probe knob plus probe 4, no
#   C ring at all, and probe 5, no proxy fence per entry either; results wrong by design):
#   how much of the cooperative epilogue's 7.9 k skeleton is the C ring's hand-overs and
#   the fences. trace_one.py on dsv3 (cooperative) with probes 3-5, with and without dbias,
#   and on qwen3 (ping-pong, without dbias: probes 4-5 refuse the ping-pong dbias) with
#   probes 3-5. About 3 min.
# Part "dstage2" (branch exp/d-stage at 016fc9d or later, main merged in; ab_old/ must hold
#   main's cudnn_ext: `git archive main cudnn_ext | tar -x -C ab_old`, untracked, not
#   ignored): session 19 measured the D staging buffers 1.9% faster on mixtral (no gain on
#   qwen3, 1.3% slower on skew) but synccheck reported divergent threads at the folder's
#   named barrier after the C producer's all-lane wait for a D buffer. The wait is on lane 0
#   now, with WARPSYNC.ALL before that BAR.SYNC in the SASS (compiled here), and so is the
#   math warps' wait for a free D buffer (a review: lane 0's full arrive could otherwise
#   precede other lanes' D writes). synccheck
#   first, then racecheck and memcheck on `chalf`, the 64-row-entry, heuristics and
#   fresh-output GPU cases, the four shapes against main, then mixtral again and K 6144,
#   N 16384 (Mixtral 8x22B) in a second pair of processes. If synccheck is clean and
#   mixtral's gain holds, the staging wants a compile-key knob the engine sets for
#   mixtral-like shapes only. About 7 min.
# Part "trim" (branch exp/epi-trim, main merged in; ab_old/ as for "dstage2"): bf16 C
#   pairs unpacked with a shift and a mask, and the dbias column sums started from their
#   first term; the cooperative epilogue's SASS loses 7% of its instructions (3,574 ->
#   3,321 per thread and tile at dsv3's shape, compiled here), and every bf16-C epilogue
#   runs the new unpacking. The whole GPU suite (4 workers), then dsv3, K 8192, K 12288
#   and the four shapes against main. About 8 min. The suite covers a merge of this branch
#   alone; after a second merge run `device_session19.sh gpu` again.
# Part "sync" (main): synccheck on the ping-pong walks (`walk`, `chalf`), which it has never
#   run on for main (only `coop`): their C producer warps wait on all lanes and then meet
#   the folder warp on a named barrier, the shape that drew exp/d-stage's report. 1 min.
# Part "verify" (main after session 20's changes; ab_old/ holding 91c7997's cudnn_ext, the
#   tree the trim/dstage2/coopc parts ran against plus exp/epi-trim): the ping-pong fold on
#   HandOver mbarriers instead of a named barrier both warps blocked on (the "sync" part's
#   synccheck report), and the cooperative deep-K knobs with 4 C stages and 3 A/B stages.
#   The whole GPU suite in 4 workers (its sanitizer tests now run synccheck on walk, chalf
#   and coop), then dsv3, K 8192, K 12288 and the four shapes against ab_old. About 5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = coopc ]; then
  vbench coopc coopc t256c2m2k,t256c2m2s3k,t256c3m2s3k,t256c4m2s3k --shapes dsv3,k8k,k12k
  grep -E "^(k8k|k12k) " "$OUT/coopc.log"
  for v in t256c2m2k t256c3m2s3k t256c4m2s3k; do
    trace "dsv3_$v" dsv3 --variant $v
  done
elif [ "$1" = ringprobe ]; then
  grep -q "probe >= 4" cudnn_ext/kernels/sm90/dglu_kernel.py \
    || { echo "check out exp/probe19 first"; exit 1; }
  for p in p3 p4 p5; do
    for db in "" --no-dbias; do
      trace "dsv3_k$p${db:+_nodb}" dsv3 --variant "t256c2m2k$p" $db
    done
    trace "qwen3_${p}_nodb" qwen3 --variant "t128c1m2h2$p" --no-dbias
  done
elif [ "$1" = dstage2 ]; then
  need_ab_old
  grep -q "_wait_on_lane0" cudnn_ext/kernels/sm90/dglu_kernel.py \
    || { echo "check out exp/d-stage first"; exit 1; }
  san synccheck chalf
  san racecheck chalf
  san memcheck chalf
  tp dstage_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half or heuristics or fresh"
  ab ab_old old
  ab ab_new new
  # mixtral again, and Mixtral 8x22B's expert MLP (K 6144, N 16384: ping-pong too)
  ab ab_old2 old --shapes mixtral,k6k
  ab ab_new2 new --shapes mixtral,k6k
  grep -hE "^k6k " "$OUT/ab_old2.log" "$OUT/ab_new2.log"
elif [ "$1" = trim ]; then
  need_ab_old
  grep -q "def _bf16_pair" cudnn_ext/kernels/sm90/dglu_kernel.py \
    || { echo "check out exp/epi-trim first"; exit 1; }
  gpu_suite trim_gpu
  ab_six
elif [ "$1" = verify ]; then
  need_ab_old
  grep -q "COOPERATIVE_DEEP_KNOBS" cudnn_ext/engines/sm90.py || { echo "main after session 20 only"; exit 1; }
  gpu_suite gpu_all
  ab_six
elif [ "$1" = sync ]; then
  san synccheck walk
  san synccheck chalf
elif [ "$1" = final ]; then
  final_bench
else
  echo "usage: device_session20.sh coopc|ringprobe|dstage2|trim|sync|verify|final"; exit 2
fi
bundle "session20_$1"  # every log and JSON in one file (the tool returns at most 8)
