#!/usr/bin/env bash
# Prepared in session 18 for the next device session (H200); parts ctas and epiprobe added in
# session 19. All parts ran in session 19 (results/session19/, whose README names the trees;
# `ctas` from main d0480a9, its half-grid traces again with 5f77312's context fix,
# CTAS_LIST=66; its no-dbias traces typed into the device tool, see that README):
#   source .gpu/env/setup.sh && bash benchmarks/device_session19.sh <part>
# Part "mbar" (branch exp/coop-dbias-mbar, main merged in; ab_old/ must hold main's
#   cudnn_ext: `git archive main cudnn_ext | tar -x -C ab_old`, untracked, not ignored):
#   the cooperative dbias through one shared slot of per-warp rows, handed block by block
#   to the folder warp on two mbarriers (session 18's named-barrier form of the same slot was
#   0.5-1.4% faster than main's shared compare-and-swap sums, but racecheck reported its
#   hand-over and synccheck the bar.sync variant). First the sanitizers (racecheck twice,
#   synccheck, memcheck on `coop`), then its GPU cases (cooperative, heuristics, JAX FFI),
#   then dsv3, K 8192 and K 12288 against main's kernel. About 7 min.
# Part "probe" (branch exp/probe-no-store-wait, a diagnostic build whose D is wrong by
#   design; ab_old/ as for "mbar"): the C producer reloads a stage without waiting for the
#   D store's read of it. If the four shapes (qwen3 above all, whose ping-pong epilogue is
#   as long as a mainloop) gain clearly more than the ~2% a sixth A/B stage is worth, a
#   separate D staging buffer (one A/B stage of shared memory) is worth building. About 2 min.
# Part "dstage" (branch exp/d-stage, an experiment worth running if "probe" shows a clear
#   gain; ab_old/ as for "mbar"): ping-pong with 64-row C entries writes D into two staging
#   buffers per warpgroup (mbarrier-phased) instead of over the C entry, so the C producer
#   reloads the entry without waiting for the D store's read; one A/B stage fewer (6 -> 5).
#   The 64-row-entry, heuristics and fresh-output GPU cases, the sanitizers on `chalf`
#   (the 64-row-entry walk), then the four shapes against main. About 6 min.
# Part "ctas" (main, added after the parts above ran): where the epilogue's time goes, by
#   grid size. trace_one.py on dsv3 (the cooperative kernel, whose epilogue is exposed) and
#   qwen3 (ping-pong, whose epilogue runs next to a mainloop), each with the resident grid
#   and with half of it (--ctas 66): a phase whose cycles per tile fall with half the CTAs
#   is bound by the chip's shared bandwidth (every CTA's epilogue at once), one that holds
#   is bound inside its SM. About 2 min.
# Part "epiprobe" (branch exp/probe19: main plus session 16's diagnostic probe knob, whose
#   results are wrong by design): trace_one.py on dsv3 (cooperative) and qwen3 (ping-pong)
#   for the kernel and probes p1 (no activation math), p2 (p1 and no C loads), p3 (p2 and
#   no D stores): the epilogue's cycles by part on session 19's kernel. About 3 min.
# Part "gpu" (main, after a merge): the whole GPU suite in 4 workers. About 5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = mbar ]; then
  need_ab_old
  san racecheck coop
  mv "$OUT/racecheck_coop.log" "$OUT/racecheck_coop_1.log"
  san racecheck coop
  san synccheck coop
  san memcheck coop
  tp mbar_tests -m gpu tests/gpu/test_sm90_correctness.py tests/test_jax_ffi.py \
    -k "cooperative or heuristics or ffi"
  ab ab_old old --shapes dsv3,k8k,k12k
  ab ab_new new --shapes dsv3,k8k,k12k
  grep -hE "^(k8k|k12k) " "$OUT/ab_old.log" "$OUT/ab_new.log"
elif [ "$1" = probe ]; then
  need_ab_old
  ab ab_old old
  ab ab_new new
elif [ "$1" = dstage ]; then
  need_ab_old
  tp dstage_tests -m gpu tests/gpu/test_sm90_correctness.py -k "c_half or heuristics or fresh"
  san racecheck chalf
  san synccheck chalf
  san memcheck chalf
  ab ab_old old
  ab ab_new new
elif [ "$1" = ctas ]; then
  for c in ${CTAS_LIST:-full 66}; do
    a=(); [ $c = full ] || a=(--ctas $c)
    t "trace_dsv3_$c" python3 benchmarks/trace_one.py dsv3 --variant t256c2m2k "${a[@]}" \
      --json "$OUT/trace_dsv3_$c.json.gz"
    t "trace_qwen3_$c" python3 benchmarks/trace_one.py qwen3 --variant t128c1m2h2 "${a[@]}" \
      --json "$OUT/trace_qwen3_$c.json.gz"
  done
elif [ "$1" = epiprobe ]; then
  grep -q "probe: int" cudnn_ext/engines/sm90.py || { echo "check out exp/probe19 first"; exit 1; }
  for p in "" p1 p2 p3; do
    t "trace_dsv3_k${p:-p0}" python3 benchmarks/trace_one.py dsv3 --variant "t256c2m2k$p" \
      --json "$OUT/trace_dsv3_k${p:-p0}.json.gz"
    t "trace_qwen3_${p:-p0}" python3 benchmarks/trace_one.py qwen3 --variant "t128c1m2h2$p" \
      --json "$OUT/trace_qwen3_${p:-p0}.json.gz"
  done
elif [ "$1" = gpu ]; then
  tp gpu_all -m gpu tests -n 4 --durations=8
  grep -E "passed|failed" "$OUT/gpu_all.log" | tail -1
elif [ "$1" = final ]; then
  final_bench
else
  echo "usage: device_session19.sh mbar|probe|dstage|ctas|epiprobe|gpu|final"; exit 2
fi
bundle "session19_$1"  # every log and JSON in one file (the tool returns at most 8)
