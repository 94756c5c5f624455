#!/usr/bin/env bash
# Session 13 on the lent H200. Part "profile" was prepared in session 12 and run first.
# Why: session 12's ncu run (results/logs/ncu-*-l2-session12.txt) measured our default
# kernel reading 1.51x (qwen3) and 1.46x (skew) the L2 sectors of grouped_mm, both at the
# same L2 throughput (77-84% of peak), and 1.36x / 1.18x its time: the larger L2 read
# volume accounts for most of the gap. By our arithmetic ~200 MB of qwen3's 267 MB excess is A re-read by 128-wide
# N-tiles (6 per row block against grouped_mm's 3), which 2x2 clusters (A multicast) would
# halve, yet 2x2 measured 2-8% slower in session 5 and 4-12% in session 12. Part "profile" tells whether
# 2x2 cuts the L2 sectors at all and, if it does, where its time goes instead: the default
# (2x1, 64-row C entries) and t128c1m2n2h2 on qwen3 and skew with dbias, the L2 sector
# counts, warp-state and per-instruction samples.
# Part "timers": the full benchmark with the device-time timer (--timer gpu, the new
# default: each call's launch hidden behind a spin kernel) and with the launch timer of
# sessions 1-12 (an idle stream, so the host's issue latency is in every span), with dbias,
# then the device-time timer without dbias. Session 12's console rows showed the GPU-time
# gap (ncu: 112.8 vs 83.9 us on qwen3) wider than the benchmark's (0.123 vs 0.102 ms).
# Parts "tile160" and "cpf" ran from branches exp/tile160 and exp/c-prefetch-late (their
# copies of this script).
#   source .gpu/env/setup.sh && bash benchmarks/device_session13.sh profile|timers|pipes|final|coop
set -o pipefail
source "$(dirname "$0")/device_common.sh"
if [ "$1" = profile ]; then
  M=lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_atom.sum
  M=$M,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
  M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed
  for shape in qwen3 skew; do for v in default t128c1m2n2h2; do
    var=""; [ $v != default ] && var="--variant $v"
    timeout 200 ncu --clock-control none --kernel-name regex:cutlass_kernel_cudnn \
      --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SourceCounters --metrics "$M" -f -o "$OUT/p_${shape}_$v" \
      python3 benchmarks/profile_one.py $shape $var > "$OUT/p_${shape}_$v.log" 2>&1
    echo "== $shape $v rc=$?"
    ncu -i "$OUT/p_${shape}_$v.ncu-rep" --page details > "$OUT/p_${shape}_$v.txt" 2>&1
    ncu -i "$OUT/p_${shape}_$v.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/p_${shape}_$v.csv" 2>&1 && gzip "$OUT/p_${shape}_$v.csv"
    rm -f "$OUT/p_${shape}_$v.ncu-rep"
    grep -E "Duration|Elapsed Cycles|lts__t_sectors_op_read|dram__bytes_read|lts__throughput" \
      "$OUT/p_${shape}_$v.txt" | head -6
  done; done
elif [ "$1" = timers ]; then
  for tm in gpu launch; do
    t "bench_$tm" python3 benchmarks/bench_dglu.py --timer $tm --reps 30 --warmup 5 \
      --out "$OUT/bench_$tm.json"
    grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead|timer" "$OUT/bench_$tm.log"
  done
  t bench_gpu_nodb python3 benchmarks/bench_dglu.py --timer gpu --no-dbias --reps 30 \
    --warmup 5 --out "$OUT/bench_gpu_nodb.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |timer" "$OUT/bench_gpu_nodb.log"
elif [ "$1" = final ]; then
  # main with the 1000 us spin: the torch/JAX framework GPU tests (their scratch rule changed
  # in 7064ae6 after session 12's run), the demo, a second full benchmark process with the
  # device-time timer, with dbias and without
  tp fw_tests -m gpu tests/test_torch_fast_path.py tests/test_torch_integration.py tests/test_jax_ffi.py
  t demo timeout 150 python3 -m cudnn_ext demo
  t bench_gpu_2 python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_gpu_2.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead|timer" "$OUT/bench_gpu_2.log"
  t bench_gpu_nodb_2 python3 benchmarks/bench_dglu.py --no-dbias --reps 30 --warmup 5 \
    --out "$OUT/bench_gpu_nodb_2.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |timer" "$OUT/bench_gpu_nodb_2.log"
elif [ "$1" = coop ]; then
  # the engine's ping-pong default against the cooperative 128 x 256 kernel under the
  # device-time timer, with dbias and without: part pipes measured dsv3 with dbias at 1.39
  # (cooperative, 1.60 GHz) vs 1.41 ms (ping-pong, 1.39 GHz) in one ncu launch, the
  # ping-pong's extra L2 and shared-memory traffic costing clock at the power cap
  vbench coop_db coop_db t256c2m2k
  vbench coop_nodb coop_nodb t256c2m2k --no-dbias
elif [ "$1" = pipes ]; then
  # ncu on qwen3 and dsv3, ours, our cooperative 128 x 256 kernel (t256c2m2k) and
  # grouped_mm: SM cycles and clock, L2 reads and the shared-memory load (does the 128 x 128
  # tile's B read twice per k-step, one 64-row WGMMA each, load the banks more than CUTLASS's
  # 128 x 256?). The tensor-pipe metric named here is not in ncu's gh100 list (skipped).
  ncu --query-metrics --chip gh100 > "$OUT/ncu_metrics_gh100.txt" 2>&1
  M=""
  for m in sm__pipe_tensor_op_gmma_cycles_active l1tex__data_bank_reads l1tex__data_bank_writes \
           l1tex__data_pipe_lsu_wavefronts_mem_shared sm__inst_executed_pipe_lsu; do
    grep -q "^$m " "$OUT/ncu_metrics_gh100.txt" && M="$M,$m.avg.pct_of_peak_sustained_elapsed"
  done
  M="${M#,},lts__t_sectors_op_read.sum,sm__cycles_active.avg"
  echo "metrics: $M"
  for shape in qwen3 dsv3; do for v in ours coop mm; do
    flag=""; [ $v = mm ] && flag="--grouped-mm"; [ $v = coop ] && flag="--variant t256c2m2k"
    kn="regex:cutlass_kernel_cudnn"; [ $v = mm ] && kn="regex:device_kernel"
    timeout 150 ncu --clock-control none --kernel-name $kn --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --metrics "$M" \
      python3 benchmarks/profile_one.py $shape $flag > "$OUT/pipes_${shape}_$v.txt" 2>&1
    echo "== $shape $v rc=$?"
    grep -E "Duration|gmma|data_bank|wavefronts|pipe_lsu|cycles_active|sectors_op" \
      "$OUT/pipes_${shape}_$v.txt" | head -10
  done; done
  gzip "$OUT/ncu_metrics_gh100.txt"
fi
bundle "session13_$1"  # every log, text and CSV in one file (the tool returns at most 8)
