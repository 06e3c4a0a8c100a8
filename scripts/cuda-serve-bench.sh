#!/usr/bin/env bash
# On a GPU machine: `moeserve serve --device cuda` with random weights of a preset shape (made on the GPU), then
# `moeserve bench` against it, the four scenarios at each concurrency; results (JSON, logs) go into OUT_DIR.
#
#   scripts/cuda-serve-bench.sh BUNDLE OUT_DIR [CONCURRENCIES] [PRESET]
#   e.g. scripts/cuda-serve-bench.sh .cuda-bundle /tmp/out "1 64" 35b-a3b
#
# BUNDLE comes from scripts/cuda-bundle.sh; the Qwen3 tokenizer from .cache/tokenizer-qwen3
# (scripts/fetch-test-data.sh). Prompts of 256 tokens, 128 generated (long_gen: 512), as llama-batched-bench
# was measured (shared docs/performance-anchors.md §9). BENCH_ARGS adds flags to every bench run.
set -euo pipefail
BUNDLE=$1
OUT=$2
CONCURRENCIES=${3:-1 64}
PRESET=${4:-35b-a3b}
PORT=${PORT:-30123}
TOKENIZER=${TOKENIZER:-.cache/tokenizer-qwen3}
mkdir -p "$OUT"
max_c=1
for c in $CONCURRENCIES; do ((c > max_c)) && max_c=$c; done
"$BUNDLE/run.sh" moeserve serve --device cuda --load-format dummy --preset "$PRESET" --tokenizer "$TOKENIZER" \
  --port "$PORT" --max-running-requests "$max_c" --max-model-len 16384 --cache-memory-gb 40 \
  --max-queued-requests 4096 ${SERVE_ARGS:-} >"$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if grep -q "moeserve ready" "$OUT/serve.log"; then break; fi
  if ! kill -0 $server 2>/dev/null; then
    echo "the server exited:"; tail -20 "$OUT/serve.log"; exit 1
  fi
  sleep 0.5
done
grep -q "moeserve ready" "$OUT/serve.log" || { echo "the server did not become ready"; tail -20 "$OUT/serve.log"; exit 1; }
grep "moeserve ready" "$OUT/serve.log"
for c in $CONCURRENCIES; do
  n=$((c < 8 ? 8 : 2 * c))
  "$BUNDLE/run.sh" moeserve bench --url "http://127.0.0.1:$PORT" --scenario all --concurrency "$c" \
    --num-requests "$n" --input-len 256 --output-len 128 --long-output-len 512 --turns 4 --tokenizer "$TOKENIZER" \
    --quiet --output "$OUT/bench-c$c.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-c$c.txt"
done
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^moeserve:(engine_steps|generation)" >"$OUT/metrics.txt" || true
