#!/usr/bin/env bash
# Prepared in session 17, run in session 18 (results/session18/README.md):
#   source .gpu/env/setup.sh && bash benchmarks/device_session18.sh <part>
# Part "gpu" (main): the whole GPU suite in 4 workers (session 17's parallel runs failed
#   only on out-of-memory next to a JAX worker that preallocated 75% of the GPU, fixed in
#   tests/conftest.py, and once on a cudaErrorUnknown launch in test_torch_fast_path.py's
#   zero-kept-scratch test, which is rerun alone first here). About 5 min.
# Part "discoop" (main): per-expert weights (b_ptrs) on the cooperative 128 x 256 kernel
#   (--discrete-variants t256c2m2k, which the engine does not offer for discrete weights)
#   against the engine's ping-pong choice and dense weights on dsv3, K 8192 and K 12288,
#   with dbias. About 3 min.
# Part "discoop_tests" (branch exp/discrete-coop, if discoop shows a gain): the heuristics and
#   cooperative GPU cases with per-expert weights on the cooperative kernel at K 7176 (K- and
#   N-major, contract and fresh outputs; the fresh variants compile on the CPU). About 3 min.
# Part "nits" (branch exp/folder-nits): the cooperative folder warp arrives on "flushed"
#   before its gpu fence and finds the tile's expert once; its GPU cases, racecheck, then
#   the dsv3-family timing against main's kernel (ab old|new: ab_old/ must hold main's
#   cudnn_ext, `git archive main cudnn_ext | tar -x -C ab_old`). About 5 min.
# Part "slots" (branch exp/coop-dbias-slots): the cooperative dbias through one shared slot
#   of per-warp rows handed block by block to the folder warp, instead of the tile's shared
#   sums that all 8 warps add into with compare-and-swap loops (ncu/trace: dbias was ~3.4 k
#   of the 16.3 k-cycle dsv3 epilogue); also runs the folder without the in-kernel fold
#   (JAX). Its GPU cases (cooperative, heuristics, JAX), racecheck and synccheck, then
#   dsv3, K 8192, K 12288 against main's kernel (ab_old/ as for "nits"). About 6 min.
#   Two risks a review named: the two math warpgroups now meet once per block (the slot's
#   barriers), which the A/B timing shows; and racecheck, which in session 17 did not
#   always follow bar.arrive -> bar.sync order, may report the hand-off (the fallback: the
#   math warps arrive_and_wait on barrier 9, where the folder is normally waiting already).
# Part "final" (main after the merges): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = gpu ]; then
  tp zero_kept -m gpu tests/test_torch_fast_path.py -k zero_kept_scratch
  tp gpu_all -m gpu tests -n 4 --durations=8
  grep -E "passed|failed" "$OUT/gpu_all.log" | tail -1
elif [ "$1" = final ]; then
  final_bench
elif [ "$1" = discoop ]; then
  t discoop python3 benchmarks/bench_dglu.py --impls cudnn_ext,cudnn_ext_discrete,torch_grouped_mm \
    --discrete-variants t256c2m2k --shapes dsv3,k8k,k12k --rounds 6 --reps 30 --warmup 5 \
    --out "$OUT/discoop.json"
  grep -E "^(dsv3|k8k|k12k) " "$OUT/discoop.log"
elif [ "$1" = discoop_tests ]; then
  tp discoop_tests -m gpu tests/gpu/test_sm90_correctness.py -k "heuristics or cooperative"
elif [ "$1" = nits ]; then
  need_ab_old
  tp nits_tests -m gpu tests/gpu/test_sm90_correctness.py -k "cooperative or heuristics"
  san racecheck coop
  ab ab_old old --shapes dsv3,k8k,k12k
  ab ab_new new --shapes dsv3,k8k,k12k
elif [ "$1" = slots ]; then
  need_ab_old
  tp slots_tests -m gpu tests/gpu/test_sm90_correctness.py tests/test_jax_ffi.py \
    -k "cooperative or heuristics or ffi"
  san racecheck coop
  san synccheck coop
  ab ab_old old --shapes dsv3,k8k,k12k
  ab ab_new new --shapes dsv3,k8k,k12k
else
  echo "usage: device_session18.sh gpu|final|discoop|discoop_tests|nits|slots"; exit 2
fi
bundle "session18_$1"  # every log and JSON in one file (the tool returns at most 8)
