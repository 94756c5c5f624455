# Sourced by the benchmarks/device_*.sh scripts: $OUT (the device tool's output folder, or
# /tmp/out) and t NAME CMD..., which runs CMD with its output in $OUT/NAME.log and prints
# one line: its exit status, seconds taken and the log's last line.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { local name=$1; shift; local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "[$name rc=$rc $((SECONDS - t0))s] $(tail -1 "$OUT/$name.log")"; }
# tp NAME PYTEST_ARGS...: t NAME python3 -m pytest ..., then the log's first failures.
tp() { local name=$1; shift
  t "$name" python3 -m pytest "$@" -q -p no:cacheprovider
  grep -E "FAILED|Error" "$OUT/$name.log" | head -6; }
# san TOOL MODE: compute-sanitizer TOOL on tests/gpu/sanitize_sm90.py MODE, then its summary.
san() { local tool=$1 mode=$2
  t "${tool}_$mode" timeout 120 compute-sanitizer --report-api-errors no --tool "$tool" \
    python3 tests/gpu/sanitize_sm90.py "$mode"
  grep -E 'SUMMARY' "$OUT/${tool}_$mode.log" | tail -1; }
# bundle NAME: pack every file in $OUT into $OUT/NAME.tgz and remove the originals (the
# device tool returns at most 8 files per call; unpack with tar -xzf here). With nothing
# left to pack it leaves an existing archive alone (session 12 lost one to an empty re-pack).
bundle() { local name=$1 list="/tmp/bundle.$$"
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.tgz' -printf '%f\n' > "$list")
  if [ ! -s "$list" ]; then rm -f "$list"; echo "[bundle] nothing new to pack in $OUT"; return 0; fi
  (cd "$OUT" && tar -czf "$name.tgz" -T "$list" && xargs rm -f < "$list")
  rm -f "$list"; echo "[bundle] $OUT/$name.tgz: $(tar -tzf "$OUT/$name.tgz" | wc -l) files"; }
# need_ab_old: stop unless ab_old/ holds an unpacked older package (git archive REV cudnn_ext
# | tar -x -C ab_old), untracked and not ignored, so that it travels to the device.
need_ab_old() {
  [ -d ab_old/cudnn_ext ] || { echo "ab_old/ missing: it must be untracked, not ignored"; exit 1; }; }
# need_branch BRANCH PATTERN: stop unless the kernel source holds PATTERN (grep -E), the
# mark of BRANCH's change, so that a part meant for a branch never runs on another tree.
need_branch() {
  grep -qE "$2" cudnn_ext/kernels/sm90/dglu_kernel.py || { echo "check out $1 first"; exit 1; }; }
# ab NAME old|new BENCH_ARGS...: bench_dglu.py, cudnn_ext against torch._grouped_mm, round-robin
# (10 rounds, 60 reps), with ab_old/'s package first on PYTHONPATH (old) or this tree's (new);
# prints which package imported and the four shapes' rows.
ab() { local name=$1 v=$2; shift 2; local pp=$PYTHONPATH
  [ "$v" = old ] && pp="$PWD/ab_old:$PYTHONPATH"
  (cd /tmp && env PYTHONPATH="$pp" python3 -c "import cudnn_ext; print('$v:', cudnn_ext.__file__)")
  t "$name" env PYTHONPATH="$pp" python3 benchmarks/bench_dglu.py \
    --impls cudnn_ext,torch_grouped_mm --rounds 10 --reps 60 --warmup 5 "$@" --out "$OUT/$name.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/$name.log"; }
# ab_six: ab_old/ against this tree on dsv3, K 8192, K 12288 and the four shapes (one
# process per tree), then the deep-K rows of both
ab_six() {
  ab ab_old old --shapes dsv3,k8k,k12k,qwen3,mixtral,skew
  ab ab_new new --shapes dsv3,k8k,k12k,qwen3,mixtral,skew
  grep -hE "^(k8k|k12k) " "$OUT/ab_old.log" "$OUT/ab_new.log"; }
# probe MODE...: racecheck on tests/gpu/racecheck_probe.py in each mode, then its summary.
probe() { local m; for m in "$@"; do
  t "probe_$m" timeout 120 compute-sanitizer --report-api-errors no --tool racecheck \
    python3 tests/gpu/racecheck_probe.py "$m"
  grep -E "SUMMARY|racecheck probe" "$OUT/probe_$m.log"; done; }
# vbench LOG JSON VARIANTS [BENCH_ARGS...]: bench_dglu.py, cudnn_ext and grouped_mm plus the
# variants (bench_dglu.variant_knobs), round-robin (10 rounds, 60 reps); the shapes' rows.
vbench() { local log=$1 json=$2 v=$3; shift 3
  t "$log" python3 benchmarks/bench_dglu.py --impls cudnn_ext,torch_grouped_mm --variants "$v" \
    --rounds 10 --reps 60 --warmup 5 "$@" --out "$OUT/$json.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) " "$OUT/$log.log"; }
# dvbench NAME VARIANTS SHAPES [BENCH_ARGS...]: vbench's twin for per-expert weights:
# bench_dglu.py, grouped_mm, the engine's own per-expert choice (cudnn_ext_discrete: the
# control row, its knobs in the JSON, so a forced variant is never mistaken for the form
# the engine picks) and the discrete VARIANTS, round-robin (10 rounds, 60 reps), on the
# comma-separated SHAPES; $OUT/NAME.{log,json}; prints the shapes' rows.
dvbench() { local name=$1 v=$2 shapes=$3; shift 3
  t "$name" python3 benchmarks/bench_dglu.py --impls torch_grouped_mm,cudnn_ext_discrete \
    --discrete-variants "$v" --rounds 10 --reps 60 --warmup 5 --shapes "$shapes" "$@" \
    --out "$OUT/$name.json"
  grep -E "^(${shapes//,/|}) " "$OUT/$name.log"; }
# coop_vs_pp NAME SHAPES: the cooperative deep-K variant (t256c4m2s3k) against the
# ping-pong default (t128c1m2h2), round-robin in one process (vbench), on the comma-separated
# SHAPES; prints the extra shapes' (k...) rows as well.
coop_vs_pp() { local name=$1 shapes=$2
  vbench "$name" "$name" t256c4m2s3k,t128c1m2h2 --shapes "$shapes"
  grep -E "^k[0-9]" "$OUT/$name.log"; }
# trace NAME TRACE_ONE_ARGS...: trace_one.py with its stamps in $OUT/trace_NAME.json.gz and
# its output in $OUT/trace_NAME.log.
trace() { local name=$1; shift
  t "trace_$name" python3 benchmarks/trace_one.py "$@" --json "$OUT/trace_$name.json.gz"; }
# final_bench: the full benchmark (every shape, every peer), the README's table, in
# $OUT/bench_final.{log,json}; prints the shapes' rows, the host overhead and the timer.
final_bench() {
  t bench_final python3 benchmarks/bench_dglu.py --reps 30 --warmup 5 --out "$OUT/bench_final.json"
  grep -E "^(dsv3|qwen3|mixtral|skew) |host overhead|timer" "$OUT/bench_final.log"; }
# gpu_suite NAME [PYTEST_ARGS...]: the whole GPU suite in 4 workers, its log in
# $OUT/NAME.log; prints the first failures and the summary line.
gpu_suite() { local name=$1; shift
  tp "$name" -m gpu tests -n 4 "$@"
  grep -E "passed|failed" "$OUT/$name.log" | tail -1; }
# std_part PART USAGE: the parts every session script ends with: "gpu" (the whole GPU suite,
# gpu_all.log) and "final" (the full benchmark); any other PART prints USAGE and exits 2.
std_part() {
  case "$1" in
    gpu) gpu_suite gpu_all ;;
    final) final_bench ;;
    *) echo "usage: $2"; exit 2 ;;
  esac; }
# split_check TESTS TOOLS: the split last round's GPU tests (tests/gpu/test_sm90_correctness.py
# -k TESTS, 4 workers), compute-sanitizer's TOOLS on sanitize_sm90.py split, then the deep-K
# cooperative form unsplit against split (t256c4m2s3k, t256c4m2s3kx3), round-robin in one
# process, on dsv3, K 8192, K 12288 and K 7168 at N 8192; prints the rows.
split_check() { local tests=$1 tools=$2 tool
  tp split_tests -m gpu tests/gpu/test_sm90_correctness.py -k "$tests" -n 4 -s
  for tool in $tools; do san "$tool" split; done
  vbench split split t256c4m2s3k,t256c4m2s3kx3 --shapes dsv3,k8k,k12k,k7kn8
  grep -E "^k[0-9]" "$OUT/split.log"; }
