#pragma once
// The CUDA backend (built with -DMOESERVE_CUDA=ON): make_backend("cuda") returns it. Design, kernels,
// numerics and measurements: docs/cuda.md.

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "common/dtype.h"

namespace moeserve {

// Visible CUDA devices (0 when there is no driver or no device).
int cuda_device_count();
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options = {});

// Tools for benchmarks and tests; `backend` must come from make_cuda_backend.
namespace cuda_tools {
// Device memory owned by the backend until it is destroyed (weights made on the GPU).
void* allocate_device(Backend& backend, size_t bytes);
// Fills n elements of a float-like dtype with reproducible values uniform in [-scale, scale).
void fill_random(Backend& backend, void* data, DType dtype, int64_t n, uint64_t seed, float scale);
void synchronize(Backend& backend);
// Per-op GPU time: with profiling on, every op synchronises and is timed with CUDA events (launch latency
// included), so totals are per-op costs, not the overlapped wall time of a step.
void set_profiling(Backend& backend, bool on);
std::string profile_report(Backend& backend);
void reset_profile(Backend& backend);
// Whether run_step may record and replay CUDA graphs (on by default).
void set_graphs(Backend& backend, bool on);
// Where replayed steps spend their time since the last call: host fill pass vs graph launch + run + sync.
std::string graph_timing(Backend& backend);
// Steps recorded as graphs and replayed since the backend was made (a step that keeps its recording across
// calls replays; one whose baked-in arguments change is recorded again).
struct GraphCounts {
  int64_t recordings = 0;
  int64_t replays = 0;
  int64_t last_nodes = 0;  // nodes (kernels and copies) of the last graph recorded
};
GraphCounts graph_counts(Backend& backend);
// Routed (token, expert) pairs from which moe_experts runs experts of these weights (bf16, or FP8 in 128x128
// blocks) and shape as a grouped tensor-core GEMM (activations rounded to bf16, or quantized to e4m3 for FP8
// weights in 128x128 blocks) rather than as MMA work items.
int64_t moe_tensor_core_min_pairs(DType weights, int64_t hidden, int64_t inter);
// Device name, memory in use and total (for reports).
std::string device_summary(Backend& backend);
}  // namespace cuda_tools

}  // namespace moeserve
