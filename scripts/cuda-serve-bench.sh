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
source "$(dirname "$0")/lib/serve.sh"
BUNDLE=$1
OUT=$2
CONCURRENCIES=${3:-1 64}
PRESET=${4:-35b-a3b}
PORT=${PORT:-30123}
TOKENIZER=${TOKENIZER:-.cache/tokenizer-qwen3}
mkdir -p "$OUT"
max_c=1
for c in $CONCURRENCIES; do ((c > max_c)) && max_c=$c; done
start_serve "$OUT/serve.log" "$BUNDLE/run.sh" moeserve serve --device cuda --load-format dummy --preset "$PRESET" \
  --tokenizer "$TOKENIZER" --port "$PORT" --max-running-requests "$max_c" --max-model-len 16384 \
  --cache-memory-gb 40 --max-queued-requests 4096 ${SERVE_ARGS:-}
grep "moeserve ready" "$OUT/serve.log"
for c in $CONCURRENCIES; do
  n=$((c < 8 ? 8 : 2 * c))
  "$BUNDLE/run.sh" moeserve bench --url "http://127.0.0.1:$PORT" --scenario all --concurrency "$c" \
    --num-requests "$n" --input-len 256 --output-len 128 --long-output-len 512 --turns 4 --tokenizer "$TOKENIZER" \
    --quiet --output "$OUT/bench-c$c.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-c$c.txt"
done
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^moeserve:(engine_steps|generation)" >"$OUT/metrics.txt" || true
