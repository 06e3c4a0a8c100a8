#!/usr/bin/env bash
# Installs ajv, ajv-formats and zod (pinned in package.json) into tests/engine/js/node_modules for the
# structured-output differential test. Idempotent; scripts/fetch-test-data.sh calls it.
set -euo pipefail
cd "$(dirname "$0")"
if [[ -f node_modules/ajv/package.json && -f node_modules/ajv-formats/package.json && -f node_modules/zod/package.json ]]; then
  exit 0
fi
npm install --silent --no-audit --no-fund --no-package-lock
echo "tests/engine/js: ajv $(node -p 'require("./node_modules/ajv/package.json").version'), zod $(node -p 'require("./node_modules/zod/package.json").version') installed"
