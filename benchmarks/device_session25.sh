#!/usr/bin/env bash
# Prepared in session 24 for the next device session (H200):
#   source .gpu/env/setup.sh && bash benchmarks/device_session25.sh <part>
# Fresh machine: two calls first. Call 1 carries [".gpu/1", ".gpu/env"] and runs
# `source .gpu/env/setup.sh`; call 2 carries [".gpu/2", ".gpu/env"] and runs `mkdir -p
# /tmp/stash && cp .gpu/2/*.whl /tmp/stash/; source .gpu/env/setup.sh && bash
# benchmarks/device_session25.sh PART` (after ../shared/gpu/pack.sh, move the apache_tvm_ffi,
# pydantic_core and torch_c_dlpack_ext wheels from .gpu/1 to .gpu/2: .gpu/1 and the tree
# together pass the 64 MiB carry limit otherwise). Later calls on the warm machine carry nothing but
# must source the setup script again. The machine goes back after ~30 s idle.
# Part "jax2" (main): the JAX FFI path's unfolded-dbias GPU test in both cooperative forms
#   (the 2-stage one has never run with dbias under jax.jit; cudnn_ext/jax/ffi.py
#   choose_knobs keeps it out until it has), then the whole JAX test file on the GPU.
# Part "disc" (main): per-expert weights' cooperative forms against their own ping-pong
#   form (t128c1m2, 128-row C entries above K 2048; session 24's cross3/cross4 timed the
#   64-row form t128c1m2h2 instead): the deep form at K 5120, 6144 (N 2048) and K 5120 N
#   8192, dsv3 as the control; the 2-stage form on skew and on uniform groups of skew's
#   size; the engine's own per-expert choice (cudnn_ext_discrete, its knobs in the JSON) as
#   the control row (device_common.sh dvbench). Round-robin in one process, dbias. About 2 min.
# Part "check" (main, after the per-expert rule change and the JAX filter's removal): the
#   heuristics GPU cases (per-expert K 4104 N-major and K 6152 now cooperative), the JAX
#   cooperative dbias GPU tests (both forms, dense and per-expert weights), then the full
#   benchmark (part final's command). About 5 min.
# Part "gaps" (main): the 2-stage band's untimed corners, round-robin in one process, dense
#   (t256c2m2k vs t128c1m2h2) and per-expert (t256c2m2k vs t128c1m2): K 4608 and N 512 on
#   skew's sizes with dbias, skew without dbias. About 3 min.
# Part "shallow" (main): below the 2-stage band, dense weights with dbias, the same A/B at K
#   3072 (N 1024 and 512) and K 2048 N 512 on skew's sizes. About 1.5 min.
# Part "eager" (main): the eager wrapper on JAX arrays on the GPU against the float64 oracle
#   (its first GPU test), then the JAX FFI file's GPU tests (ffi.kernel_config factored
#   out). About 2 min.
# Part "edges" (main): the same A/B at N 768 (inside the band; dense and per-expert) and
#   N 1536 (past its N edge; dense) on skew's sizes, dbias. About 2 min.
# Part "edges2" (main): N 1536 with uniform groups (u4kn15), dense, dbias. About 1 min.
# Part "gpu" (main): the whole GPU suite in 4 workers. About 5.5 min.
# Part "final" (main): the full benchmark for the README's table. About 2 min.
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = jax2 ]; then
  tp jax_coop -m gpu tests/test_jax_ffi.py -k cooperative_dbias_on_gpu
  grep -E "passed|failed" "$OUT/jax_coop.log" | tail -1
  tp jax_all -m gpu tests/test_jax_ffi.py
  grep -E "passed|failed" "$OUT/jax_all.log" | tail -1
elif [ "$1" = disc ]; then
  dvbench disc_deep t256c4m2s3kx3,t128c1m2 k5k,k6kd,k5kn8,dsv3
  dvbench disc_mid t256c2m2k,t128c1m2 skew,u4kn1
elif [ "$1" = check ]; then
  tp heur -m gpu tests/gpu/test_sm90_correctness.py -k heuristics -n 4
  grep -E "passed|failed" "$OUT/heur.log" | tail -1
  tp jax_coop -m gpu tests/test_jax_ffi.py -k cooperative_dbias_on_gpu
  grep -E "passed|failed" "$OUT/jax_coop.log" | tail -1
  final_bench
elif [ "$1" = gaps ]; then
  vbench gaps_dense gaps_dense t256c2m2k,t128c1m2h2 --shapes skewk46,skewn5
  grep -E "^skew[a-z0-9]+ " "$OUT/gaps_dense.log"
  vbench gaps_nodb gaps_nodb t256c2m2k,t128c1m2h2 --shapes skew --no-dbias
  dvbench gaps_disc t256c2m2k,t128c1m2 skewk46,skewn5
  dvbench gaps_disc_nodb t256c2m2k,t128c1m2 skew --no-dbias
elif [ "$1" = shallow ]; then
  vbench shallow shallow t256c2m2k,t128c1m2h2 --shapes skewk3,skewk3n5,skewk2n5
  grep -E "^skew[a-z0-9]+ " "$OUT/shallow.log"
elif [ "$1" = eager ]; then
  tp eager -m gpu tests/test_jax.py
  grep -E "passed|failed" "$OUT/eager.log" | tail -1
  tp jax_ffi -m gpu tests/test_jax_ffi.py
  grep -E "passed|failed" "$OUT/jax_ffi.log" | tail -1
elif [ "$1" = edges ]; then
  vbench edges_dense edges_dense t256c2m2k,t128c1m2h2 --shapes skewn7,skewn15
  grep -E "^skew[a-z0-9]+ " "$OUT/edges_dense.log"
  dvbench edges_disc t256c2m2k,t128c1m2 skewn7
elif [ "$1" = edges2 ]; then
  vbench edges2 edges2 t256c2m2k,t128c1m2h2 --shapes u4kn15
  grep -E "^u4kn15 " "$OUT/edges2.log"
else
  std_part "$1" "device_session25.sh jax2|disc|check|gaps|shallow|eager|edges|edges2|gpu|final"
fi
bundle "session25_$1"  # every log and JSON in one file (the tool returns at most 8)
