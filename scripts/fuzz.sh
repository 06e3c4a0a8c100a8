#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer + ASan + UBSan) into build-fuzz/ and runs it for
# SECONDS (default 300) on a scratch copy of tests/fuzz/corpus. New inputs stay in build-fuzz/corpus; to keep a
# few, merge them back: build-fuzz/safetensors_fuzz -merge=1 tests/fuzz/corpus build-fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_FUZZ=ON \
  -DMOESERVE_BUILD_TESTS=OFF -DMOESERVE_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target safetensors_fuzz
mkdir -p build-fuzz/corpus
cp -n tests/fuzz/corpus/* build-fuzz/corpus/ 2>/dev/null || true
build-fuzz/safetensors_fuzz -max_total_time="$seconds" -max_len=4096 -dict=tests/fuzz/safetensors.dict \
  -print_final_stats=1 build-fuzz/corpus
