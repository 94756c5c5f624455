# Sourced by the benchmarks/device_*.sh scripts: $OUT (the device tool's output folder, or
# /tmp/out) and t NAME CMD..., which runs CMD with its output in $OUT/NAME.log and prints
# one line: its exit status, seconds taken and the log's last line.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { local name=$1; shift; local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "[$name rc=$rc $((SECONDS - t0))s] $(tail -1 "$OUT/$name.log")"; }
