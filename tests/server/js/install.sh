#!/usr/bin/env bash
# Installs the official OpenAI and Anthropic SDKs (npm packages openai and @anthropic-ai/sdk, pinned in
# package.json) into tests/server/js/node_modules for the end-to-end tests. Idempotent; scripts/fetch-test-data.sh
# calls it.
set -euo pipefail
cd "$(dirname "$0")"
if [[ -f node_modules/openai/package.json && -f node_modules/@anthropic-ai/sdk/package.json ]]; then exit 0; fi
npm install --silent --no-audit --no-fund --no-package-lock
echo "tests/server/js: openai SDK $(node -p 'require("./node_modules/openai/package.json").version')," \
  "Anthropic SDK $(node -p 'require("./node_modules/@anthropic-ai/sdk/package.json").version') installed"
