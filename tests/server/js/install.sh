#!/usr/bin/env bash
# Installs the official OpenAI SDK (npm package openai, pinned in package.json) into tests/server/js/node_modules
# for the end-to-end tests. Idempotent; scripts/fetch-test-data.sh calls it.
set -euo pipefail
cd "$(dirname "$0")"
if [[ -f node_modules/openai/package.json ]]; then exit 0; fi
npm install --silent --no-audit --no-fund --no-package-lock
echo "tests/server/js: openai SDK $(node -p 'require("./node_modules/openai/package.json").version') installed"
