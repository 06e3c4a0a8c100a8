#include "backend/cuda/fp8_lt.h"
#include "backend/cuda/fp8_quant.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kBlock = kFp8QuantBlock;  // the scale block along K, of the weights and of the activations

// One warp per (token, 128 columns) (fp8_quant.cuh). Scales are token-fastest: s[b * n + t], the layout
// cuBLASLt's VEC128 mode reads for B (the outer dimension contiguous, as DeepGEMM's and PyTorch's 1x128
// activation scales are; token-major scales gave results off by a factor of ~20).
__global__ void quantize_fp8_vec128(const float* __restrict__ x, int64_t n, int64_t cols,
                                    uint8_t* __restrict__ q, float* __restrict__ scales) {
  pdl_begin();
  const int64_t blocks = cols / kBlock;
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  if (w >= n * blocks) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = w / blocks, b = w % blocks, off = t * cols + b * kBlock + 4 * lane;
  const float4 f = *reinterpret_cast<const float4*>(x + off);
  const float v[4] = {f.x, f.y, f.z, f.w};
  const float scale = quantize_e4m3_x4(v, q + off);
  if (lane == 0) scales[b * n + t] = scale;
}

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

}  // namespace

Fp8LtGemm::Fp8LtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) lt_ = nullptr;
}

Fp8LtGemm::~Fp8LtGemm() {
  for (auto& [key, p] : plans_) {
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  }
  if (lt_) cublasLtDestroy(lt_);
}

size_t Fp8LtGemm::scratch_bytes(int64_t n, int64_t cols) {
  return align256(size_t(n * cols)) + size_t(n * (cols / kBlock)) * sizeof(float);
}

Fp8LtGemm::Plan& Fp8LtGemm::plan(int64_t rows, int64_t cols, int64_t n) {
  auto [it, fresh] = plans_.try_emplace({rows, cols, n});
  Plan& p = it->second;
  if (!fresh) return p;
  // D [n][rows] (column-major rows x n) = op(A) op(B): A the weights, stored K-contiguous (OP_T), B = x.
  cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN));
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode));
  cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(cols), uint64_t(rows), cols);
  cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(cols), uint64_t(n), cols);
  cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, uint64_t(rows), uint64_t(n), rows);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  // The heuristic offers no block-scaled algorithm while the scale pointers are unset (CUDA 13 on the H200):
  // any device address stands in for them here; run() sets the real ones per call.
  const void* placeholder = workspace_;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                                 sizeof(placeholder));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                                 sizeof(placeholder));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  p.ok = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &heur, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found > 0;
  if (p.ok) p.algo = heur.algo;
  cublasLtMatmulPreferenceDestroy(pref);
  return p;
}

bool Fp8LtGemm::supports(const WeightView& w, int64_t n) {
  if (!lt_ || w.type != WType::FP8 || w.block_rows != kBlock || w.block_cols != kBlock) return false;
  // Whole blocks, and column blocks in fours: with 2 (K = 256) cuBLASLt's kernels for 128 tokens and more gave
  // wrong results on the H200 (CudaOps.Fp8PrefillMatmulAtSmallModelShapes); PyTorch requires the scales'
  // leading dimension in fours for this mode too. The deployment's K (2048, 4096, 512) are all in fours.
  if (w.rows % kBlock != 0 || w.cols % (4 * kBlock) != 0 || n <= 0) return false;
  return plan(w.rows, w.cols, n).ok;
}

cublasStatus_t Fp8LtGemm::run(const float* x, int64_t n, const WeightView& w, float* y, void* scratch,
                              cudaStream_t stream) {
  Plan& p = plan(w.rows, w.cols, n);
  auto* q = static_cast<uint8_t*>(scratch);
  auto* sx = reinterpret_cast<float*>(static_cast<char*>(scratch) + align256(size_t(n * w.cols)));
  const int64_t warps = n * (w.cols / kBlock);
  launch_k(quantize_fp8_vec128, blocks_for(warps * 32, 256), 256, 0, stream, x, n, w.cols, q, sx);
  // The scale pointers change per call (the activations' scratch, the matrix's scales); the descriptor is
  // read when the GEMM is enqueued, so setting them here is safe under stream capture too.
  const void* sa = w.scale_inv;
  const void* sb = sx;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  const float one = 1.0f, zero = 0.0f;
  return cublasLtMatmul(lt_, p.desc, &one, w.data, p.a, q, p.b, &zero, y, p.c, y, p.c, &p.algo, workspace_,
                        workspace_bytes_, stream);
}

}  // namespace moeserve::cuda
