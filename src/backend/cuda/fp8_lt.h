#pragma once
// FP8 matmuls of prefill size on FP8 tensor cores through cuBLASLt's block-scaled GEMM (CUDA 12.9+): the
// weights as the checkpoint stores them (e4m3, one float scale per 128x128 block), the activations quantized
// on the fly to e4m3 with one scale per token and 128 columns (amax / 448), as SGLang's and vLLM's FP8 block
// paths (DeepGEMM, CUTLASS) do. The product is float32. Its error against the bf16 path is the activations'
// e4m3 rounding, about 3% relative for a random row; that is the deployment's numerics, not a reference's.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

class Fp8LtGemm {
 public:
  Fp8LtGemm(void* workspace, size_t workspace_bytes);
  ~Fp8LtGemm();
  Fp8LtGemm(const Fp8LtGemm&) = delete;
  Fp8LtGemm& operator=(const Fp8LtGemm&) = delete;

  // Whether y = x wᵀ of n rows can take this path: FP8 weights in 128x128 blocks, whole blocks, and an
  // algorithm for the shape (asked once per shape; false thereafter if cuBLASLt has none).
  bool supports(const WeightView& w, int64_t n);
  // Device scratch run() needs: the quantized activations and their scales.
  static size_t scratch_bytes(int64_t n, int64_t cols);
  // Quantizes x [n][w.cols] (16-byte aligned) into scratch and enqueues the GEMM into y [n][w.rows] on
  // `stream`; returns cuBLASLt's status.
  cublasStatus_t run(const float* x, int64_t n, const WeightView& w, float* y, void* scratch,
                     cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  Plan& plan(int64_t rows, int64_t cols, int64_t n);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace moeserve::cuda
