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
# device tool returns at most 8 files per call; unpack with tar -xzf here).
bundle() { local name=$1
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.tgz' -printf '%f\n' > "/tmp/bundle.$$" \
    && tar -czf "$name.tgz" -T "/tmp/bundle.$$" && xargs rm -f < "/tmp/bundle.$$")
  rm -f "/tmp/bundle.$$"; echo "[bundle] $OUT/$name.tgz: $(tar -tzf "$OUT/$name.tgz" | wc -l) files"; }
