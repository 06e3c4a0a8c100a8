# Sourced by the scripts that benchmark a served model (scripts/cuda-serve-bench.sh, cuda-image-bench.sh).
#
#   start_serve LOG COMMAND...
#
# Runs COMMAND (a `moeserve serve` line) in the background with its output in LOG, stops it when the script
# exits, and returns once LOG says "moeserve ready". Weights made on the GPU take a while, so it waits up to
# five minutes; if the server exits or is not ready by then, the script ends with the log's last lines.
start_serve() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  SERVE_PID=$!
  trap 'kill $SERVE_PID 2>/dev/null; wait $SERVE_PID 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    if grep -q "moeserve ready" "$log"; then return 0; fi
    if ! kill -0 "$SERVE_PID" 2>/dev/null; then
      echo "the server exited:"
      tail -20 "$log"
      exit 1
    fi
    sleep 0.5
  done
  echo "the server did not become ready"
  tail -20 "$log"
  exit 1
}
