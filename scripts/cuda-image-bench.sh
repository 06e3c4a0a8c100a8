#!/usr/bin/env bash
# On a GPU machine: image TTFT beside text-only TTFT at a preset's shape (issue 20's figures). `moeserve serve
# --device cuda --load-format dummy` (random weights and a random vision tower of the preset's shape, made on
# the GPU / host), the Qwen3.5 chat template (it writes image parts), then `moeserve bench`: single_turn, and
# the image scenario with one picture at each side. Results (JSON, logs) go into OUT_DIR.
#
#   scripts/cuda-image-bench.sh BUNDLE OUT_DIR [SIDES] [PRESET] [CONCURRENCY]
#   e.g. scripts/cuda-image-bench.sh .cuda-bundle /tmp/out "448 1024" 35b-a3b 1
#
# BUNDLE comes from scripts/cuda-bundle.sh; the Qwen3 tokenizer from .cache/tokenizer-qwen3
# (scripts/fetch-test-data.sh). Prompts of 256 tokens, 128 generated. BENCH_ARGS adds flags to every bench run.
set -euo pipefail
source "$(dirname "$0")/lib/serve.sh"
BUNDLE=$1
OUT=$2
SIDES=${3:-448 1024}
PRESET=${4:-35b-a3b}
CONCURRENCY=${5:-1}
PORT=${PORT:-30124}
TOKENIZER=${TOKENIZER:-.cache/tokenizer-qwen3}
mkdir -p "$OUT"
start_serve "$OUT/serve.log" "$BUNDLE/run.sh" moeserve serve --device cuda --load-format dummy --preset "$PRESET" \
  --tokenizer "$TOKENIZER" --chat-template tests/fixtures/chat-templates/qwen3_5.jinja --port "$PORT" \
  --max-model-len 16384 --cache-memory-gb 40 ${SERVE_ARGS:-}
grep -E "vision tower|moeserve ready" "$OUT/serve.log"
n=$((CONCURRENCY < 8 ? 16 : 4 * CONCURRENCY))
bench() {
  "$BUNDLE/run.sh" moeserve bench --url "http://127.0.0.1:$PORT" --concurrency "$CONCURRENCY" --num-requests "$n" \
    --input-len 256 --output-len 128 --tokenizer "$TOKENIZER" --quiet "$@" ${BENCH_ARGS:-}
}
bench --scenario single_turn --output "$OUT/text.json" 2>&1 | tee "$OUT/text.txt"
for side in $SIDES; do
  bench --scenario image --image-size "$side" --output "$OUT/image-$side.json" 2>&1 | tee "$OUT/image-$side.txt"
done
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^moeserve:image" >"$OUT/metrics.txt" || true
