#!/usr/bin/env bash
# Configures and builds moeserve into build/ (CPU only unless MOESERVE_CUDA=ON is in the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-test-data.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_CUDA="${MOESERVE_CUDA:-OFF}" \
  ${MOESERVE_CMAKE_ARGS:-}
cmake --build build -j "$(nproc)"
