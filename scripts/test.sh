#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (ctest). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
