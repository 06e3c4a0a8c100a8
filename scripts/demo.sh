#!/usr/bin/env bash
# The main job on the embedded default: builds moeserve, writes the demo model (a random-weight Qwen3.5 MoE
# with the real Qwen3 vocabulary) and generates from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
if [[ ! -f demo-model/config.json ]]; then
  build/moeserve init-model --preset tiny --vocab-from .cache/tokenizer-qwen3/tokenizer.json --out demo-model
fi
build/moeserve generate --model demo-model --prompt-ids 9707,1879,0 --max-tokens 16
