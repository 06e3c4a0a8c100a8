#!/usr/bin/env bash
# Builds the CUDA binaries on this (Debian 12) machine and bundles them, with the shared libraries a stock CUDA
# machine lacks, into one folder that runs on a GPU machine with CUDA 13 (Ubuntu 24.04 H200 image included).
#
#   scripts/cuda-bundle.sh [OUT_DIR] [ARCHS]     default OUT_DIR=.cuda-bundle, ARCHS=90a (the H200)
#   then, on the GPU machine, from the repository root:  OUT_DIR/run.sh <binary> [args...]
#   e.g. .cuda-bundle/run.sh cuda_backend_tests; .cuda-bundle/run.sh moeserve verify --device cuda --model M
#
# glibc 2.36 here and libstdc++ from gcc 12 are older than the target's, so the binaries run there; cuBLAS and
# the driver come from the target's CUDA; Highway, fmt and spdlog travel in OUT_DIR/lib.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.cuda-bundle}
ARCHS=${2:-90a}
BUILD=${BUILD:-build-cuda-bundle}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=ON \
  -DMOESERVE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc ${MOESERVE_CMAKE_ARGS:-} >/dev/null
# MOESERVE_CMAKE_ARGS adds cmake flags (e.g. "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
# -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"); TARGETS (space-separated) narrows what is built, e.g. TARGETS="cuda_backend_tests" while iterating.
read -r -a TARGETS <<<"${TARGETS:-moeserve cuda_backend_tests cuda_ops_bench cuda_model_bench}"
cmake --build "$BUILD" --target "${TARGETS[@]}" -j2
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for t in "${TARGETS[@]}"; do
  find "$BUILD" -type f -name "$t" -perm -u+x -exec cp {} "$OUT/bin/" \;
done
strip --strip-debug "$OUT"/bin/*
# Libraries outside glibc, the C++ runtime and CUDA itself.
for bin in "$OUT"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
cat > "$OUT/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs a bundled binary with the bundled libraries and the machine's CUDA: run.sh <binary> [args...]
DIR=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$DIR/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$1
shift
exec "$DIR/bin/$bin" "$@"
RUN
chmod +x "$OUT/run.sh"
du -sh "$OUT"
