#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (ctest). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
# Then every fuzz target for a fixed number of runs from a fixed seed (scripts/fuzz.sh), where clang is there.
if command -v clang++ >/dev/null 2>&1; then scripts/fuzz.sh --runs "${MOESERVE_FUZZ_RUNS:-20000}"; fi
