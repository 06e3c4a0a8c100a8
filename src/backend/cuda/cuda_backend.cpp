// The CUDA backend: device memory (weights, activations, caches), op dispatch to the kernels of kernels.h and
// cuBLAS, and the record/replay of decode steps as CUDA graphs.
//
// Everything runs on one stream, so device work is ordered like the calls; the host waits only in download()
// (and argmax), where the caller needs the data. Activations come from a caching pool: a buffer freed by the
// host while kernels still use it is handed out again only to work queued after them.
//
// Graphs (run_step): the first call with a key runs the step eagerly with its allocations in a pool of the
// key's own; the second records it (stream capture) and replays it; later calls run the step's host code in
// "fill" mode, where ops issue nothing but restage their host inputs (positions, page tables, token ids) into
// the key's pinned arena, which the graph's first node copies to the device. Each op folds the arguments the
// graph baked in into a signature; a fill whose signature or allocation sequence differs from the recording
// is discarded and the step runs eagerly instead.

#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cuda/fp8_lt.h"
#include "backend/cuda/kernels.h"
#include "common/error.h"

namespace moeserve {
namespace {

using cuda::WeightView;
using cuda::WType;

void cuda_ok(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess)
    fail("CUDA error {} ({}) in {} (cuda_backend.cpp:{})", cudaGetErrorName(e), cudaGetErrorString(e), what,
         line);
}
void cublas_ok(cublasStatus_t s, const char* what, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error {} in {} (cuda_backend.cpp:{})", int(s), what, line);
}
#define CUDA_OK(expr) cuda_ok((expr), #expr, __LINE__)
#define CUBLAS_OK(expr) cublas_ok((expr), #expr, __LINE__)

static_assert(cuda::kLogitsTopkMax == kMaxLogitsTopk &&
              logits_topk_record_floats(0) == cuda::kLogitsTopkHeaderFloats);

constexpr size_t kAlign = 256;
size_t align_up(size_t n, size_t a = kAlign) {
  return (n + a - 1) / a * a;
}

// Matmuls of at most this many rows stream the weights (GEMV); larger ones are tiled GEMMs.
constexpr int64_t kGemvMaxRows = 8;
// Matrices with fewer rows than this keep float32 activations at every batch size.
constexpr int64_t kTensorCoreMinRows = 512;

// FP8 matmuls of fp8_mma_min_rows()..fp8_mma_max_rows() rows run on tensor cores over the FP8 bytes
// (launch_gemm_mma): up to 8 rows instead of the GEMV (whose float32 FMAs are bound by loading x), above
// instead of widening the matrix to bf16 for cuBLAS. MOESERVE_CUDA_FP8_MMA_MIN_ROWS / _MAX_ROWS move the
// bounds (for measuring; MAX 0 turns the path off). bf16 matmuls of 3..8 rows take the same kernels
// (MOESERVE_CUDA_BF16_MMA=0: the GEMV, for measuring); from 9 rows cuBLAS.
int64_t env_rows(const char* name, int64_t fallback) {
  const char* e = std::getenv(name);
  return e ? std::atoll(e) : fallback;
}
// FP8 prefill matmuls on cuBLASLt's block-scaled FP8 GEMM (fp8_lt.h); MOESERVE_CUDA_FP8_LT=0 widens the
// weights to bf16 for cuBLAS instead (for measuring, and for bf16-activation numerics).
bool fp8_lt_enabled() {
  static const bool v = env_rows("MOESERVE_CUDA_FP8_LT", 1) != 0;
  return v;
}
int64_t fp8_mma_min_rows() {
  static const int64_t v = env_rows("MOESERVE_CUDA_FP8_MMA_MIN_ROWS", 2);
  return v;
}
int64_t fp8_mma_max_rows() {
  static const int64_t v = env_rows("MOESERVE_CUDA_FP8_MMA_MAX_ROWS", 64);
  return v;
}
// bf16 at 3..8 rows: the GEMV's 8-token kernel (5..8 rows) moves half the bytes per second of its 1..4-token
// ones, and at 3..4 rows the MMA still wins on the layers' matrices (8192x2048 at 4 rows 16.4 against
// 19.5 us; at 2 rows a model step was slower); the 248320-row lm_head streams faster as a 4-token GEMV
// (358 against 401 us), so matrices taller than this keep the GEMV up to 4 rows (cuda_ops_bench gemv).
constexpr int64_t kBf16MmaTallRows = 65536;
// bf16 experts of prefill-sized batches run as cuBLAS grouped GEMMs from this many routed pairs per expert
// on average (MOESERVE_CUDA_MOE_CUBLAS_MIN; a huge value keeps the backend's grouped kernel, for measuring).
// bf16 matrices of few outputs (router, gates, GDN b/a) take the three-term tensor-core GEMM from this many
// rows (MOESERVE_CUDA_SPLIT_GEMM_MIN_ROWS; 0 turns it off) and matrices of at least kSplitGemmMinOutputs
// outputs: below them the pass that splits x costs what it saves.
int64_t split_gemm_min_rows() {
  static const int64_t v = env_rows("MOESERVE_CUDA_SPLIT_GEMM_MIN_ROWS", 1024);
  return v;
}
constexpr int64_t kSplitGemmMinOutputs = 128;
int64_t cublas_moe_min_pairs_per_expert() {
  static const int64_t v = env_rows("MOESERVE_CUDA_MOE_CUBLAS_MIN", 128);
  return v;
}
bool bf16_mma_enabled() {
  static const bool v = env_rows("MOESERVE_CUDA_BF16_MMA", 1) != 0;
  return v;
}
// matmul_n's FP8 and bf16 matrices in one MMA launch at decode sizes; MOESERVE_CUDA_MIXED_MMA=0 gives each
// dtype its own launch, for measuring.
bool mixed_mma_enabled() {
  static const bool v = env_rows("MOESERVE_CUDA_MIXED_MMA", 1) != 0;
  return v;
}
// Matrices of few outputs (router, gates, GDN b/a) take cuBLAS's float32 GEMM over a float32 copy of the
// weights from this many rows (cuda_ops_bench small_gemm measures both sides); fewer rows stream the weights.
// MOESERVE_CUDA_SMALL_SGEMM_MIN_ROWS moves it (0 turns the path off).
int64_t small_sgemm_min_rows() {
  static const int64_t v = env_rows("MOESERVE_CUDA_SMALL_SGEMM_MIN_ROWS", 64);
  return v;
}
// Attention in bf16 mode on tensor cores, prefill and batched decode (attention.cu);
// MOESERVE_CUDA_ATTENTION_TC=0 keeps the float32 kernels. Read at every call, so that cuda_ops_bench compares
// both in one process.
bool attention_tensor_cores() {
  return env_rows("MOESERVE_CUDA_ATTENTION_TC", 1) != 0;
}
// Prefill sequences of at least this many tokens run the chunked delta rule on tensor cores; shorter ones
// the recurrent kernel (cuda_ops_bench gdn measures both). Read at every call so that the benchmark can
// compare the two forms in one process (MOESERVE_CUDA_GDN_CHUNKED_MIN=0 takes the chunked form always).
int64_t gdn_chunked_min_tokens() {
  return env_rows("MOESERVE_CUDA_GDN_CHUNKED_MIN", 64);
}

WType wtype(DType t) {
  switch (t) {
    case DType::F32:
      return WType::F32;
    case DType::F16:
      return WType::F16;
    case DType::BF16:
      return WType::BF16;
    case DType::F8_E4M3:
      return WType::FP8;
    default:
      fail("the CUDA backend cannot use {} weights", dtype_name(t));
  }
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

// A caching allocator: freed blocks wait in per-size free lists (LIFO). Sizes are rounded to a power of two
// up to 1 MiB and to whole MiB above, so a step's buffers find their blocks again on the next step.
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() { free_all(); }

  void* allocate(size_t bytes) {
    const size_t size = bucket(bytes);
    auto& list = free_[size];
    void* p = nullptr;
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
      idle_bytes_ -= size;
    } else {
      if (cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError();
        release_cached();
        CUDA_OK(cudaMalloc(&p, size));
      }
      blocks_.emplace(p, size);
    }
    live_.emplace(p, size);
    return p;
  }
  bool owns(void* p) const { return live_.count(p) != 0; }
  void release(void* p) {
    auto it = live_.find(p);
    if (it == live_.end()) return;
    free_[it->second].push_back(p);
    idle_bytes_ += it->second;
    live_.erase(it);
  }
  // Bytes held in the free lists: given back to the device when an allocation fails (release_cached), so
  // they count as free for memory-pressure sensing. Read from any thread.
  size_t idle_bytes() const { return idle_bytes_.load(std::memory_order_relaxed); }
  size_t held_bytes() const {
    size_t total = 0;
    for (const auto& [p, size] : blocks_) total += size;
    return total;
  }

 private:
  static size_t bucket(size_t bytes) {
    bytes = std::max<size_t>(bytes, kAlign);
    constexpr size_t kMiB = size_t(1) << 20;
    return bytes <= kMiB ? std::bit_ceil(bytes) : align_up(bytes, kMiB);
  }
  // Out of memory: give the cached free blocks back (after the work that may still use them).
  void release_cached() {
    cudaDeviceSynchronize();
    for (auto& [size, list] : free_)
      for (void* p : list) {
        cudaFree(p);
        blocks_.erase(p);
      }
    free_.clear();
    idle_bytes_ = 0;
  }
  void free_all() {
    for (const auto& [p, size] : blocks_) cudaFree(p);
    blocks_.clear();
    free_.clear();
    idle_bytes_ = 0;
    live_.clear();
  }
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> live_;
  std::unordered_map<void*, size_t> blocks_;
  std::atomic<size_t> idle_bytes_{0};
};

// Long-lived device memory handed out by bumping through large chunks (weights, expert tables).
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* c : chunks_) cudaFree(c);
  }
  void* allocate(size_t bytes) {
    bytes = align_up(std::max<size_t>(bytes, 1));
    if (used_ + bytes > size_) {
      const size_t chunk = std::max(bytes, kChunk);
      void* p = nullptr;
      CUDA_OK(cudaMalloc(&p, chunk));
      chunks_.push_back(p);
      base_ = static_cast<char*>(p);
      size_ = chunk;
      used_ = 0;
      total_ += chunk;
    }
    void* p = base_ + used_;
    used_ += bytes;
    return p;
  }
  size_t total() const { return total_; }

 private:
  static constexpr size_t kChunk = size_t(256) << 20;
  std::vector<void*> chunks_;
  char* base_ = nullptr;
  size_t size_ = 0, used_ = 0, total_ = 0;
};

// Pinned host memory mirrored by device memory: host inputs of ops are written here and copied over.
struct StagingArena {
  char* host = nullptr;
  char* dev = nullptr;
  size_t capacity = 0;
  size_t used = 0;

  void reserve(size_t bytes) {
    release();
    capacity = std::max<size_t>(bytes, kAlign);
    CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&host), capacity));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dev), capacity));
    used = 0;
  }
  void release() {
    if (host) cudaFreeHost(host);
    if (dev) cudaFree(dev);
    host = dev = nullptr;
    capacity = used = 0;
  }
};

enum class Mode { Eager, Measure, Capture, Fill };

struct PinnedBuffer {
  void* host = nullptr;
  size_t bytes = 0;
};

// One recorded step.
struct StepGraph {
  enum class State { Fresh, Seen, Ready, Disabled } state = State::Fresh;
  DevicePool pool;
  StagingArena arena;
  size_t dyn_bytes = 0;
  std::vector<size_t> download_sizes;                 // in call order
  std::vector<PinnedBuffer> staging;                  // one per download
  std::vector<std::pair<void*, size_t>> allocations;  // recorded (address, bytes) in call order
  size_t replay_at = 0;
  uint64_t signature = 0;
  cudaGraphExec_t exec = nullptr;
  int failures = 0;  // consecutive recordings that could not be replayed

  ~StepGraph() { reset(); }
  void reset() {
    if (exec) cudaGraphExecDestroy(exec);
    exec = nullptr;
    arena.release();
    for (auto& s : staging) cudaFreeHost(s.host);
    staging.clear();
    download_sizes.clear();
    allocations.clear();
  }
};

// Keyed by the experts' array; the first and last experts' weights make sure a hit is that array and not a
// later one at a freed array's address (tests build expert sets of one size in turn).
struct ExpertTableEntry {
  cuda::ExpertTable table;
  size_t count = 0;
  const void* first_gate = nullptr;
  const void* last_down = nullptr;
};

struct ProfileEntry {
  int64_t calls = 0;
  double ms = 0;
};

class CudaBackend final : public Backend, public CacheMemory {
 public:
  explicit CudaBackend(const BackendOptions& options) : fp32_matmul_(options.fp32_matmul) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      fail("no CUDA device is visible (driver missing, or CUDA_VISIBLE_DEVICES empty)");
    }
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaGetDeviceProperties(&props_, 0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_OK(cublasCreate(&cublas_));
    CUBLAS_OK(cublasSetStream(cublas_, stream_));
    CUDA_OK(cudaMalloc(&cublas_workspace_, kCublasWorkspace));
    CUBLAS_OK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace));
    fp8_lt_ = std::make_unique<cuda::Fp8LtGemm>(cublas_workspace_, kCublasWorkspace);
    eager_.reserve(size_t(8) << 20);
    CUDA_OK(cudaEventCreate(&ev_start_));
    CUDA_OK(cudaEventCreate(&ev_stop_));
    CUDA_OK(cudaEventCreateWithFlags(&moe_plan_ready_, cudaEventDisableTiming));
    CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&moe_plan_host_), kMoePlanHostInts * sizeof(int32_t)));
    sync_each_op_ = std::getenv("MOESERVE_CUDA_SYNC") != nullptr;
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    graphs_.clear();
    for (auto& [p, range] : caches_) cudaFree(const_cast<char*>(p));
    eager_.release();
    cudaFree(cublas_workspace_);
    cublasDestroy(cublas_);
    cudaEventDestroy(ev_start_);
    cudaEventDestroy(ev_stop_);
    cudaEventDestroy(moe_plan_ready_);
    cudaFreeHost(moe_plan_host_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }

  // ---- memory ------------------------------------------------------------------------------------------
  Buffer allocate(size_t floats) override {
    const size_t bytes = std::max<size_t>(floats, 1) * sizeof(float);
    void* p = nullptr;
    if (mode_ == Mode::Fill) {
      p = replay_allocation(bytes);
    } else if (graph_) {
      p = graph_->pool.allocate(bytes);
      if (mode_ == Mode::Capture) graph_->allocations.emplace_back(p, bytes);
    } else {
      p = pool_.allocate(bytes);
    }
    return Buffer(static_cast<float*>(p), BufferDeleter{this, floats});
  }
  void release(float* p, size_t) override {
    if (mode_ == Mode::Fill) return;
    if (graph_ && graph_->pool.owns(p))
      graph_->pool.release(p);
    else
      pool_.release(p);
  }
  void fill_zero(float* x, size_t n) override {
    if (auto op = start("fill_zero", x, n)) CUDA_OK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
  }
  void copy(const float* src, float* dst, size_t n) override {
    if (auto op = start("copy", src, dst, n))
      CUDA_OK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void upload(const float* host, float* dst, size_t n) override {
    if (mode_ == Mode::Eager) {
      if (auto op = start("upload", dst, n))
        CUDA_OK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
      return;
    }
    const void* staged = stage(host, n * sizeof(float));
    if (auto op = start("upload", staged, dst, n))
      CUDA_OK(cudaMemcpyAsync(dst, staged, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void download(const float* src, float* host, size_t n) override {
    download_bytes(src, host, n * sizeof(float));
  }

  Matrix random_matrix(DType dtype, int64_t rows, int64_t cols, uint64_t seed, float bound) override {
    check(dtype == DType::BF16 || dtype == DType::F32 || dtype == DType::F8_E4M3,
          "random_matrix: {} is not made on the GPU", dtype_name(dtype));
    const size_t n = size_t(rows * cols);
    void* p = allocate_device(n * dtype_size(dtype));
    if (dtype != DType::F8_E4M3) {
      fill_random(p, dtype, int64_t(n), seed, bound);
      return Matrix{dtype, rows, cols, p};
    }
    // FP8 as the checkpoints ship it: e4m3 codes over their whole range, one scale per 128x128 block (random
    // in ±bound / 448, so |w| ≤ bound as for the other dtypes; a negative scale only flips signs).
    fill_random(p, dtype, int64_t(n), seed, 448.0f);
    Matrix m{dtype, rows, cols, p};
    m.block_rows = m.block_cols = 128;
    const int64_t blocks = (rows + 127) / 128 * m.scale_cols();
    auto* scales = static_cast<float*>(allocate_device(size_t(blocks) * sizeof(float)));
    fill_random(scales, DType::F32, blocks, seed ^ 0x5ca1e5ULL, bound / 448.0f);
    m.scale_inv = scales;
    return m;
  }
  void prepare(const Matrix& w) override { weight(w); }
  void prepare(const float* weights, size_t n) override { vec(weights, n); }
  CacheMemory* cache_memory() override { return this; }
  std::optional<MemoryInfo> device_memory() const override {
    // Any thread may ask: its current device is 0 unless it chose another, and so is the backend's.
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || total_b == 0) {
      cudaGetLastError();  // clear this thread's error: the figure is optional
      return std::nullopt;
    }
    // The activation pool's cached free blocks are the process's to reuse or give back, not pressure: a
    // server that has run one 8K-token prefill would otherwise count those gigabytes as used for good.
    return MemoryInfo{std::min<uint64_t>(total_b, free_b + pool_.idle_bytes()), total_b};
  }

  // CacheMemory
  float* allocate_cache(size_t floats) override {
    return static_cast<float*>(allocate_cache_bytes(std::max<size_t>(floats, 1) * sizeof(float), false));
  }
  // The GDN kernels read and write a bf16 range's state in place (cache_state_type finds it by address).
  uint16_t* allocate_cache_bf16(size_t values) override {
    return static_cast<uint16_t*>(allocate_cache_bytes(std::max<size_t>(values, 2) * sizeof(uint16_t), true));
  }
  void* allocate_cache_bytes(size_t bytes, bool bf16) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, bytes));
    CUDA_OK(cudaMemsetAsync(p, 0, bytes, stream_));
    caches_.emplace(static_cast<char*>(p), CacheRange{bytes, bf16});
    return p;
  }
  void free_cache(float* p) override {
    auto it = caches_.find(reinterpret_cast<char*>(p));
    if (it == caches_.end()) return;
    cudaStreamSynchronize(stream_);
    cudaFree(p);
    caches_.erase(it);
  }
  void zero_cache(float* p, size_t floats) override { fill_zero(p, floats); }
  void copy_cache(const float* src, float* dst, size_t floats) override { copy(src, dst, floats); }

  // ---- graphs ------------------------------------------------------------------------------------------
  void run_step(uint64_t key, const std::function<void()>& step) override {
    if (!graphs_enabled_ || mode_ != Mode::Eager || profiling_) {
      step();
      return;
    }
    auto& g = graphs_[key];
    if (!g) g = std::make_unique<StepGraph>();
    switch (g->state) {
      case StepGraph::State::Disabled:
        step();
        return;
      case StepGraph::State::Fresh:
        measure(*g, step);
        return;
      case StepGraph::State::Seen:
        capture(*g, step);
        return;
      case StepGraph::State::Ready:
        replay(*g, step);
        return;
    }
  }

  // ---- ops ---------------------------------------------------------------------------------------------
  void matmul(const float* x, int64_t n, const Matrix& w, float* y) override {
    check(n >= 0, "matmul: negative row count");
    const WeightView v = weight(w);
    const char* label = matmul_label(v);
    // Few rows, or matrices with few outputs (router, gates, GDN b/a): the weight-streaming kernel, float32
    // activations, token groups of 8 re-reading an L2-resident matrix. Exact, and no rounding can flip the
    // router's top-k.
    // FP8 at decode and batched-decode sizes: tensor cores over the FP8 bytes (≤ 8 rows as exact as the
    // GEMV; more: activations rounded to bf16 as below).
    if (small_mma(v, x, n)) {
      auto scratch = allocate((cuda::gemm_mma_scratch_bytes(n, v.cols) + 3) / 4);
      if (auto op = start(label, x, n, v.data, y, scratch.get()))
        cuda::launch_gemm_mma(x, n, &v, &y, 1, scratch.get(), stream_);
      return;
    }
    if (n <= kGemvMaxRows || v.rows < kTensorCoreMinRows) {
      if (split_gemm(v, n)) {
        // bf16 weights from split_gemm_min_rows() rows (the router at prefill): x as three bf16 terms
        // through three bf16 tensor-core GEMMs into one float32 sum, float32-accurate like the SGEMM below
        // (the weights are exact in bf16), at tensor-core rate: 8,192 rows of the router took 236 us as
        // SGEMM (docs/cuda.md).
        auto terms = allocate(size_t((3 * n * v.cols + 1) / 2));
        if (auto op = start(label, x, n, v.data, y, terms.get())) {
          auto* t = reinterpret_cast<uint16_t*>(terms.get());
          cuda::launch_to_bf16_terms(x, t, n * v.cols, stream_);
          for (int i = 0; i < 3; ++i) {
            const float one = 1.0f, beta = i == 0 ? 0.0f : 1.0f;
            CUBLAS_OK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(v.rows), int(n), int(v.cols), &one,
                                   v.data, CUDA_R_16BF, int(v.cols), t + i * n * v.cols, CUDA_R_16BF,
                                   int(v.cols), &beta, y, CUDA_R_32F, int(v.rows), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
          }
        }
        return;
      }
      // From small_sgemm_min_rows() rows the GEMV re-reads the matrix once per group of 8 rows (167 us for
      // the router at 1,024 tokens); cuBLAS's SGEMM is as exact (float32 products and sums, no TF32).
      if (const float* wf = n > kGemvMaxRows ? widened_f32(v, n) : nullptr) {
        const float one = 1.0f, zero = 0.0f;
        if (auto op = start(label, x, n, wf, y))
          CUBLAS_OK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(v.rows), int(n), int(v.cols), &one, wf,
                                int(v.cols), x, int(v.cols), &zero, y, int(v.rows)));
        return;
      }
      if (auto op = start(label, x, n, v.data, y)) cuda::launch_gemv(x, n, v, y, stream_);
      return;
    }
    // Float32 tiled GEMM for exact mode and dtypes cuBLAS does not take here.
    if (fp32_matmul_ || v.type == WType::F32 || v.type == WType::F16) {
      if (auto op = start(label, x, n, v.data, y)) cuda::launch_gemm_simt(x, n, v, y, stream_);
      return;
    }
    // FP8 above the MMA kernel's rows (prefill): FP8 tensor cores, activations quantized per 1x128 block.
    if (v.type == WType::FP8 && fp8_lt_enabled() && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        fp8_lt_supports(v, n)) {
      auto scratch = allocate((cuda::Fp8LtGemm::scratch_bytes(n, v.cols) + 3) / 4);
      if (auto op = start(label, x, n, v.data, v.scale_inv, y, scratch.get()))
        CUBLAS_OK(fp8_lt_->run(x, n, v, y, scratch.get(), stream_));
      return;
    }
    // bf16 tensor cores through cuBLAS: activations rounded to bf16, FP8 weights widened to bf16 first.
    auto xb = allocate(size_t((n * v.cols + 1) / 2));
    Buffer wb;
    if (v.type == WType::FP8) wb = allocate(size_t((v.rows * v.cols + 1) / 2));
    if (auto op = start(label, x, n, v.data, y, xb.get(), wb.get())) {
      auto* xh = reinterpret_cast<uint16_t*>(xb.get());
      cuda::launch_to_bf16(x, xh, n * v.cols, stream_);
      const void* wdata = v.data;
      if (wb) {
        cuda::launch_dequant_bf16(v, reinterpret_cast<uint16_t*>(wb.get()), stream_);
        wdata = wb.get();
      }
      gemm_bf16(wdata, v, xh, n, y);
    }
  }

  // y [n][v.rows] = xh [n][v.cols] · wᵀ, bf16 operands (w as v's shape), float32 out, on cuBLAS.
  void gemm_bf16(const void* w, const WeightView& v, const uint16_t* xh, int64_t n, float* y) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_OK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(v.rows), int(n), int(v.cols), &one, w,
                           CUDA_R_16BF, int(v.cols), xh, CUDA_R_16BF, int(v.cols), &zero, y, CUDA_R_32F,
                           int(v.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // Whether matmul() takes an n-row product over v to cuBLAS with bf16 weights as stored (x rounded to bf16).
  bool bf16_cublas(const WeightView& v, int64_t n) const {
    return v.type == WType::BF16 && !fp32_matmul_ && n > kGemvMaxRows && v.rows >= kTensorCoreMinRows;
  }

  void embed(std::span<const int32_t> tokens, const Matrix& table, float* out) override {
    for (int32_t t : tokens)
      check(t >= 0 && t < table.rows, "token id {} is outside the vocabulary (0..{})", t, table.rows - 1);
    const WeightView v = weight(table);
    const void* ids = stage(tokens.data(), tokens.size_bytes());
    if (auto op = start("embed", ids, tokens.size(), v.data, out))
      cuda::launch_embed(static_cast<const int32_t*>(ids), int64_t(tokens.size()), v, out, stream_);
  }

  void add(float* x, const float* y, size_t n) override {
    if (auto op = start("add", x, y, n)) cuda::launch_add(x, y, int64_t(n), stream_);
  }

  void add_rms_norm(float* h, const float* y, int64_t rows, int64_t dim, const float* w, float eps,
                    float* out) override {
    const float* wd = vec(w, size_t(dim));
    if (auto op = start("add_rms_norm", h, y, rows, dim, wd, eps, out))
      cuda::launch_add_rms_norm(h, y, rows, dim, wd, eps, out, stream_);
  }

  void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t x_stride, const float* w, float eps,
                bool zero_centred, float* out, int64_t out_stride) override {
    const float* wd = vec(w, size_t(dim));
    if (auto op = start("rms_norm", x, rows, dim, x_stride, wd, eps, zero_centred, out, out_stride))
      cuda::launch_rms_norm(x, rows, dim, x_stride, wd, eps, zero_centred, out, out_stride, stream_);
  }

  void gated_rms_norm(const float* o, const float* z, int64_t rows, int64_t dim, const float* w, float eps,
                      float* out) override {
    const float* wd = vec(w, size_t(dim));
    if (auto op = start("gated_rms_norm", o, z, rows, dim, wd, eps, out))
      cuda::launch_gated_rms_norm(o, z, rows, dim, wd, eps, out, stream_);
  }

  void rope(float* x, int64_t tokens, int heads, int head_dim, int rotary_dim, int64_t start_pos,
            const float* inv_freq) override {
    const float* f = vec(inv_freq, size_t(rotary_dim / 2));
    const auto* pos = static_cast<const int64_t*>(stage(&start_pos, sizeof start_pos));
    if (auto op = start("rope", x, tokens, heads, head_dim, rotary_dim, pos, f))
      cuda::launch_rope(x, tokens, heads, head_dim, rotary_dim, pos, f, stream_);
  }

  // A layer's pages and their stored dtype (the kernels read bf16 and FP8 pages as they are).
  static void set_cache(cuda::AttentionArgs& a, KvCache& kv, int layer) {
    const auto& spec = kv.spec();
    check(spec.layer_page_bytes() == spec.page_size * spec.bytes_per_row(),
          "attention: KV pages of {} bytes are padded; CUDA needs pages of whole 16-byte rows",
          spec.layer_page_bytes());
    a.k_cache = kv.key_data(layer, 0), a.v_cache = kv.value_data(layer, 0), a.page_size = spec.page_size;
    a.kv_type = spec.dtype == DType::BF16      ? cuda::WType::BF16
                : spec.dtype == DType::F8_E4M3 ? cuda::WType::FP8
                                               : cuda::WType::F32;
    a.k_scale = kv.k_scale(layer), a.v_scale = kv.v_scale(layer);
  }

  void paged_attention(const float* q, const float* k_new, const float* v_new, int64_t T, int heads,
                       int kv_heads, int head_dim, int64_t start_pos, std::span<const int32_t> pages,
                       KvCache& kv, int layer, float* out) override {
    const auto& spec = kv.spec();
    check(spec.memory == this,
          "attention: the KV cache is not in this GPU's memory (size it with the model's "
          "kv_cache_spec(), which asks the backend for its cache memory)");
    check(cuda::attention_head_dim_supported(head_dim),
          "attention: head_dim {} is not supported on CUDA "
          "(32, 64, 128 or 256)",
          head_dim);
    check(kv_heads > 0 && heads % kv_heads == 0, "attention: {} heads do not group over {} KV heads", heads,
          kv_heads);
    const int64_t capacity = int64_t(pages.size()) * spec.page_size;
    check(capacity >= start_pos + T, "attention: page table covers {} positions, need {}", capacity,
          start_pos + T);
    cuda::AttentionArgs a;
    a.q = q, a.k_new = k_new, a.v_new = v_new, a.T = T;
    a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim;
    a.start_pos = static_cast<const int64_t*>(stage(&start_pos, sizeof start_pos));
    a.pages = static_cast<const int32_t*>(stage(pages.data(), pages.size_bytes()));
    a.num_pages = int64_t(pages.size());
    set_cache(a, kv, layer);
    a.out = out;
    a.splits = cuda::attention_splits(T, heads, kv_heads, capacity);
    a.tensor_cores = !fp32_matmul_ && attention_tensor_cores();
    Buffer part_out, part_m, part_l;
    if (a.splits > 1) {
      const size_t rows = size_t(a.splits * T * heads);
      part_out = allocate(rows * size_t(head_dim));
      part_m = allocate(rows);
      part_l = allocate(rows);
      a.part_out = part_out.get(), a.part_m = part_m.get(), a.part_l = part_l.get();
    }
    if (auto op = start("paged_attention", q, k_new, v_new, T, heads, kv_heads, head_dim, a.start_pos,
                        a.pages, a.num_pages, a.k_cache, a.v_cache, a.kv_type, a.k_scale, a.v_scale, out,
                        a.splits, a.part_out, a.tensor_cores))
      cuda::launch_attention(a, stream_);
  }

  // Batched decode: one prologue launch (norms, RoPE, cache writes) and one attention launch (+ the split-K
  // combine) for all sequences; positions and page tables are staged inputs.
  void attention_decode(const float* qg, float* k, const float* v, int64_t n, int heads, int kv_heads,
                        int head_dim, const float* q_norm, const float* k_norm, float eps, int rotary_dim,
                        const float* inv_freq, std::span<const int64_t> positions,
                        std::span<const int64_t> rope_offsets,
                        std::span<const std::span<const int32_t>> pages, KvCache& kv, int layer,
                        float* out) override {
    const auto& spec = kv.spec();
    check(spec.memory == this,
          "attention: the KV cache is not in this GPU's memory (size it with the model's "
          "kv_cache_spec(), which asks the backend for its cache memory)");
    check(cuda::attention_head_dim_supported(head_dim),
          "attention: head_dim {} is not supported on CUDA (32, 64, 128 or 256)", head_dim);
    check(kv_heads > 0 && heads % kv_heads == 0, "attention: {} heads do not group over {} KV heads", heads,
          kv_heads);
    check(rotary_dim % 2 == 0 && rotary_dim <= head_dim, "attention: rotary dim {} of head dim {}",
          rotary_dim, head_dim);
    check(int64_t(positions.size()) == n && int64_t(pages.size()) == n,
          "attention_decode: {} sequences, {} tables", n, pages.size());
    check(rope_offsets.empty() || int64_t(rope_offsets.size()) == n,
          "attention_decode: {} sequences, {} offsets", n, rope_offsets.size());
    // The table stride is baked into a recorded step (the staged table's size, the split count): a power of
    // two of at least 16 pages, it changes a few times over a long generation rather than with every page a
    // sequence grows by (a change costs an eager step and a new recording). Entries past a sequence's own
    // table are never read: each row attends up to its own position.
    size_t stride = 16;
    for (const auto& p : pages)
      while (stride < p.size()) stride *= 2;
    decode_pages_.assign(size_t(n) * stride, 0);
    for (int64_t i = 0; i < n; ++i) {
      const auto& p = pages[size_t(i)];
      check(int64_t(p.size()) * spec.page_size > positions[size_t(i)],
            "attention: page table covers {} positions, need {}", int64_t(p.size()) * spec.page_size,
            positions[size_t(i)] + 1);
      std::copy(p.begin(), p.end(), decode_pages_.begin() + i * int64_t(stride));
    }
    const float* qn = vec(q_norm, size_t(head_dim));
    const float* kn = vec(k_norm, size_t(head_dim));
    const float* f = vec(inv_freq, size_t(std::max(rotary_dim / 2, 1)));
    cuda::AttentionArgs a;
    a.T = n, a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim;
    a.start_pos = static_cast<const int64_t*>(stage(positions.data(), positions.size_bytes()));
    // Staged whether or not there are offsets, so that steps with and without images replay one recording.
    decode_rope_.assign(positions.begin(), positions.end());
    for (size_t i = 0; i < rope_offsets.size(); ++i) decode_rope_[i] += rope_offsets[i];
    const auto* rope_pos = static_cast<const int64_t*>(stage(decode_rope_.data(), positions.size_bytes()));
    a.pages =
        static_cast<const int32_t*>(stage(decode_pages_.data(), decode_pages_.size() * sizeof(int32_t)));
    a.num_pages = int64_t(stride);
    a.pages_stride = int64_t(stride);
    a.batch = true;
    set_cache(a, kv, layer);
    a.out = out;
    a.tensor_cores = !fp32_matmul_ && attention_tensor_cores();
    a.splits = cuda::attention_decode_splits(n, heads, kv_heads, int64_t(stride) * spec.page_size);
    auto q = allocate(size_t(n * heads * head_dim));
    a.q = q.get();
    Buffer part_out, part_m, part_l;
    if (a.splits > 1) {
      const size_t rows = size_t(a.splits * n * heads);
      part_out = allocate(rows * size_t(head_dim));
      part_m = allocate(rows);
      part_l = allocate(rows);
      a.part_out = part_out.get(), a.part_m = part_m.get(), a.part_l = part_l.get();
    }
    if (auto op = start("attention_decode", qg, k, v, n, heads, kv_heads, head_dim, qn, kn, eps, rotary_dim,
                        f, a.start_pos, rope_pos, a.pages, a.num_pages, a.k_cache, a.v_cache, a.kv_type,
                        a.k_scale, a.v_scale, out, a.splits, a.part_out, a.q, a.tensor_cores)) {
      cuda::launch_attention_decode_prep(qg, q.get(), k, v, n, qn, kn, eps, rotary_dim, f, rope_pos, a,
                                         stream_);
      cuda::launch_attention(a, stream_);
    }
  }

  void mul_sigmoid(float* x, const float* gate, int64_t rows, int64_t dim, int64_t gate_stride) override {
    if (auto op = start("mul_sigmoid", x, gate, rows, dim, gate_stride))
      cuda::launch_mul_sigmoid(x, gate, rows, dim, gate_stride, stream_);
  }

  void causal_conv1d_silu(const float* x, int64_t T, int64_t channels, const float* w, int kernel,
                          float* state, float* out) override {
    check(kernel >= 1 && kernel <= 8, "causal conv: kernel size {} is not supported on CUDA (1..8)", kernel);
    const cuda::StateType st = cache_state_type(state, "causal conv state");
    const float* wd = vec(w, size_t(channels * kernel));
    if (auto op = start("causal_conv1d_silu", x, T, channels, wd, kernel, state, out))
      cuda::launch_conv1d_silu(x, T, channels, wd, kernel, state, st, out, stream_);
  }

  void gdn_gates(const float* b, const float* a, const float* a_log, const float* dt_bias, int64_t T,
                 int v_heads, float* beta, float* g) override {
    const float* al = vec(a_log, size_t(v_heads));
    const float* dt = vec(dt_bias, size_t(v_heads));
    if (auto op = start("gdn_gates", b, a, al, dt, T, v_heads, beta, g))
      cuda::launch_gdn_gates(b, a, al, dt, T, v_heads, beta, g, stream_);
  }

  void gated_delta_rule(const DeltaRuleShape& s, const float* q, const float* k, int64_t qk_stride,
                        const float* v, int64_t v_stride, const float* g, const float* beta, int64_t T,
                        float* state, float* out) override {
    check(s.k_dim <= 128, "gated delta rule: key head dim {} is not supported on CUDA (at most 128)",
          s.k_dim);
    check(s.k_heads > 0 && s.v_heads % s.k_heads == 0, "gated delta rule: {} value heads over {} key heads",
          s.v_heads, s.k_heads);
    const cuda::StateType st = cache_state_type(state, "gated delta rule state");
    const size_t qk = size_t(T) * s.k_heads * s.k_dim;
    auto qn = allocate(qk), kn = allocate(qk);
    // The chunked form's tensor cores round to bf16: exact mode (fp32_matmul) keeps the recurrence.
    const bool chunked = !fp32_matmul_ && T > 0 && T >= gdn_chunked_min_tokens() &&
                         cuda::delta_rule_chunked_supported(s.k_dim, s.v_dim, v, v_stride);
    Buffer scratch;
    if (chunked) scratch = allocate(cuda::delta_rule_chunked_scratch_floats(T, s.v_heads));
    if (auto op = start("gated_delta_rule", q, k, qk_stride, v, v_stride, g, beta, T, state, out, qn.get(),
                        kn.get(), scratch.get(), s.k_heads, s.v_heads, s.k_dim, s.v_dim)) {
      cuda::launch_l2norm_qk(q, k, qk_stride, T, s.k_heads, s.k_dim, 1.0f / std::sqrt(float(s.k_dim)),
                             qn.get(), kn.get(), stream_);
      if (chunked)
        cuda::launch_delta_rule_chunked(qn.get(), kn.get(), s.k_heads, v, v_stride, s.v_heads, g, beta, T,
                                        state, st, out, scratch.get(), stream_);
      else
        cuda::launch_delta_rule(qn.get(), kn.get(), s.k_heads, s.k_dim, v, v_stride, s.v_heads, s.v_dim, g,
                                beta, T, state, st, out, stream_);
    }
  }

  void swiglu(const SwiGlu& w, const float* x, int64_t n, float* out) override {
    const WeightView g = weight(w.gate), u = weight(w.up), d = weight(w.down);
    auto h = allocate(size_t(n * g.rows));
    if (n <= kGemvMaxRows && g.type == u.type && g.rows == u.rows && g.cols == u.cols) {
      if (auto op = start("swiglu", x, n, g.data, u.data, d.data, h.get(), out)) {
        cuda::launch_gemv_swiglu(x, n, g, u, h.get(), stream_);
        cuda::launch_gemv(h.get(), n, d, out, stream_);
      }
      return;
    }
    // Larger batches: three matmuls (tensor cores where they apply) around an elementwise silu-mul. The outer
    // scope times them as one op; in fill mode the nested ops still stage and sign themselves.
    auto up = allocate(size_t(n * u.rows));
    auto op = start("swiglu", x, n, g.data, u.data, d.data, h.get(), up.get(), out);
    const Matrix* gate_up[] = {&w.gate, &w.up};
    float* const gate_up_out[] = {h.get(), up.get()};
    matmul_n(x, n, gate_up, gate_up_out);
    if (auto silu = start("silu_mul", h.get(), up.get(), n))
      cuda::launch_silu_mul(h.get(), up.get(), h.get(), n * g.rows, stream_);
    matmul(h.get(), n, w.down, out);
  }

  void moe_experts(std::span<const SwiGlu> experts, const float* router_logits, int top_k, bool renormalize,
                   const float* x, int64_t n, int64_t hidden, float* out) override {
    const auto& table = expert_table(experts);
    check(table.hidden == hidden, "moe: experts take {} inputs, the activations have {}", table.hidden,
          hidden);
    check(top_k >= 1 && top_k <= 16 && top_k <= table.experts,
          "moe: top-k {} is not supported on CUDA (1..16)", top_k);
    const int64_t P = n * top_k;
    const bool tc =
        !fp32_matmul_ && P >= cuda::moe_grouped_min_pairs(table) && cuda::moe_mma_supported(table);
    if (tc && cublas_experts(table, n, top_k)) {
      moe_experts_cublas(experts, table, router_logits, top_k, renormalize, x, n, out);
      return;
    }
    const int tile = cuda::moe_tile(table, n, top_k, tc, fp32_matmul_);
    const int64_t max_items = cuda::moe_max_items(P, table.experts, tile);
    cuda::MoeScratch s;
    const MoePlanBuffers plan = moe_plan_buffers(P, max_items, s);
    // bf16 h and gathered inputs on the tensor-core and pipelined paths (two per float), float32 h elsewhere.
    const bool bf16_rows = tc || cuda::moe_items_pipe_used(table, tile, tc, fp32_matmul_);
    auto h = bf16_rows ? allocate(size_t((P * table.inter + 1) / 2)) : allocate(size_t(P * table.inter));
    auto xb = bf16_rows ? allocate(size_t((P * hidden + 1) / 2)) : Buffer();
    auto y = allocate(size_t(P * hidden));
    s.h = h.get();
    s.xb = reinterpret_cast<uint16_t*>(xb.get());
    s.y = y.get();
    if (auto op = start("moe_experts", router_logits, top_k, renormalize, x, n, out, tc, s.ids, s.h, s.xb,
                        s.y, table.gate))
      cuda::launch_moe(table, router_logits, top_k, renormalize, x, n, tile, tc, fp32_matmul_, s, out,
                       stream_);
  }

  // The routing and plan buffers of P (token, expert) pairs and max_items work items, pointed to from s.
  struct MoePlanBuffers {
    Buffer ids, weights, sorted, pair_row, items, num_items;
  };
  MoePlanBuffers moe_plan_buffers(int64_t P, int64_t max_items, cuda::MoeScratch& s) {
    auto ints = [&](int64_t count) { return allocate(size_t(count)); };  // int32 and float share a size
    MoePlanBuffers b{ints(P), allocate(size_t(P)), ints(P), ints(P), ints(3 * max_items), ints(1)};
    s.ids = reinterpret_cast<int32_t*>(b.ids.get());
    s.weights = b.weights.get();
    s.sorted = reinterpret_cast<int32_t*>(b.sorted.get());
    s.pair_row = reinterpret_cast<int32_t*>(b.pair_row.get());
    s.items = reinterpret_cast<int32_t*>(b.items.get());
    s.num_items = reinterpret_cast<int32_t*>(b.num_items.get());
    return b;
  }

  // Prefill-sized bf16 experts on cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx), which outruns the
  // backend's grouped kernel there (docs/cuda.md). It needs each expert's row count on the host: routing and
  // the plan run on the device as in launch_moe (one item per chosen expert), then the item table comes back
  // (a synchronisation, so eager steps only; graph-recorded steps keep the kernel). Gate and up write bf16
  // rows [gate | up], silu * up makes h, down writes bf16 rows (cuBLAS's grouped GEMM has no float32 output
  // for bf16 inputs), and the combine adds them with the routing weights.
  bool cublas_experts(const cuda::ExpertTable& t, int64_t n, int top_k) const {
    return mode_ == Mode::Eager && t.type == WType::BF16 && t.hidden % 8 == 0 && t.inter % 8 == 0 &&
           n * top_k >= cublas_moe_min_pairs_per_expert() * t.experts;
  }

  // One cublasGemmGroupedBatchedEx call's host arrays: a group per problem (row counts differ per expert).
  struct GroupedGemm {
    std::vector<cublasOperation_t> ta, tb;
    std::vector<int> m, n, k, lda, ldb, ldc, sizes;
    std::vector<float> alpha, beta;
    std::vector<const void*> a, b;
    std::vector<void*> c;
    // Row-major out[rows][ldc] (from column 0 of c) = x[rows][K] (row stride ldx) · w[N][K]ᵀ, all bf16.
    void add(const void* w, int64_t N, int64_t K, const void* x, int64_t ldx, void* out, int64_t ld_out,
             int64_t rows) {
      ta.push_back(CUBLAS_OP_T), tb.push_back(CUBLAS_OP_N);
      m.push_back(int(N)), n.push_back(int(rows)), k.push_back(int(K));
      lda.push_back(int(K)), ldb.push_back(int(ldx)), ldc.push_back(int(ld_out));
      sizes.push_back(1), alpha.push_back(1.0f), beta.push_back(0.0f);
      a.push_back(w), b.push_back(x), c.push_back(out);
    }
  };

  void run_grouped(const GroupedGemm& g) {
    const auto* a = static_cast<const void* const*>(stage(g.a.data(), g.a.size() * sizeof(void*)));
    const auto* b = static_cast<const void* const*>(stage(g.b.data(), g.b.size() * sizeof(void*)));
    auto* c = static_cast<void* const*>(const_cast<void*>(stage(g.c.data(), g.c.size() * sizeof(void*))));
    CUBLAS_OK(cublasGemmGroupedBatchedEx(
        cublas_, g.ta.data(), g.tb.data(), g.m.data(), g.n.data(), g.k.data(), g.alpha.data(), a, CUDA_R_16BF,
        g.lda.data(), b, CUDA_R_16BF, g.ldb.data(), g.beta.data(), c, CUDA_R_16BF, g.ldc.data(),
        int(g.sizes.size()), g.sizes.data(), CUBLAS_COMPUTE_32F));
  }

  void moe_experts_cublas(std::span<const SwiGlu> experts, const cuda::ExpertTable& t,
                          const float* router_logits, int top_k, bool renormalize, const float* x, int64_t n,
                          float* out) {
    const int64_t P = n * top_k, H = t.hidden, I = t.inter;
    const int64_t max_items = cuda::moe_max_items(P, t.experts, int(P));
    cuda::MoeScratch s;
    const MoePlanBuffers plan_buffers = moe_plan_buffers(P, max_items, s);
    // bf16 rows, two per float: gathered x, [gate | up], h, y.
    auto xb = allocate(size_t((P * H + 1) / 2)), gu = allocate(size_t(P * I)),
         h = allocate(size_t((P * I + 1) / 2)), y = allocate(size_t((P * H + 1) / 2));
    s.xb = reinterpret_cast<uint16_t*>(xb.get());
    s.y = y.get();
    auto op = start("moe_experts", router_logits, top_k, renormalize, x, n, out, s.ids, s.xb, s.y, t.gate);
    if (!op) return;
    cuda::launch_moe_route(t, router_logits, top_k, renormalize, n, int(P), s, stream_);
    // The plan to the host, then the gather: the host waits for the copy alone and builds the GEMM lists
    // while the GPU gathers.
    check(size_t(1 + 3 * max_items) <= kMoePlanHostInts, "moe: {} plan items", max_items);
    const int32_t* plan = moe_plan_host_;
    CUDA_OK(cudaMemcpyAsync(moe_plan_host_, s.num_items, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaMemcpyAsync(moe_plan_host_ + 1, s.items, size_t(3 * max_items) * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaEventRecord(moe_plan_ready_, stream_));
    cuda::launch_moe_gather_bf16(x, P, H, top_k, s.sorted, s.xb, stream_);
    CUDA_OK(cudaEventSynchronize(moe_plan_ready_));
    const auto* xrows = reinterpret_cast<const uint16_t*>(xb.get());
    auto* gurows = reinterpret_cast<uint16_t*>(gu.get());
    auto* hrows = reinterpret_cast<uint16_t*>(h.get());
    auto* yrows = reinterpret_cast<uint16_t*>(y.get());
    GroupedGemm gate_up, down;
    for (int i = 0; i < plan[0]; ++i) {
      const int32_t e = plan[1 + 3 * i], first = plan[2 + 3 * i], rows = plan[3 + 3 * i];
      const SwiGlu& w = experts[size_t(e)];
      gate_up.add(weight(w.gate).data, I, H, xrows + first * H, H, gurows + first * 2 * I, 2 * I, rows);
      gate_up.add(weight(w.up).data, I, H, xrows + first * H, H, gurows + first * 2 * I + I, 2 * I, rows);
      down.add(weight(w.down).data, H, I, hrows + first * I, I, yrows + first * H, H, rows);
    }
    run_grouped(gate_up);
    cuda::launch_moe_silu_mul_bf16(gurows, P, I, hrows, stream_);
    run_grouped(down);
    cuda::launch_moe_combine(t, n, top_k, s, /*bf16_y=*/true, out, stream_);
  }

  void add_sigmoid_gated(float* out, const float* y, const float* gate_logit, int64_t rows,
                         int64_t dim) override {
    if (auto op = start("add_sigmoid_gated", out, y, gate_logit, rows, dim))
      cuda::launch_add_sigmoid_gated(out, y, gate_logit, rows, dim, stream_);
  }

  // Decode-sized: the matrices as segments of one GEMV launch (the GDN and attention input projections).
  // ---- the vision tower's ops ---------------------------------------------------------------------------
  void add_bias(float* x, const float* bias, int64_t rows, int64_t dim) override {
    const float* bd = vec(bias, size_t(dim));
    if (auto op = start("add_bias", x, bd, rows, dim)) cuda::launch_add_bias(x, bd, rows, dim, stream_);
  }

  void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b, float eps,
                  float* out) override {
    const float* wd = vec(w, size_t(dim));
    const float* bd = vec(b, size_t(dim));
    if (auto op = start("layer_norm", x, rows, dim, wd, bd, eps, out))
      cuda::launch_layer_norm(x, rows, dim, wd, bd, eps, out, stream_);
  }

  void gelu(float* x, size_t n, bool tanh_approx) override {
    const float k_tanh = std::sqrt(2.0f / float(M_PI));  // as the CPU rounds it
    if (auto op = start("gelu", x, n, tanh_approx))
      cuda::launch_gelu(x, int64_t(n), tanh_approx, k_tanh, stream_);
  }

  void rope_table(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, int rotary_dim,
                  const float* cos, const float* sin) override {
    check(rotary_dim % 2 == 0 && rotary_dim <= head_dim, "rope_table: rotary_dim {} of head_dim {}",
          rotary_dim, head_dim);
    if (auto op = start("rope_table", x, rows, row_stride, heads, head_dim, rotary_dim, cos, sin))
      cuda::launch_rope_table(x, rows, row_stride, heads, head_dim, rotary_dim, cos, sin, stream_);
  }

  // Tensor cores (q, k, v rounded to bf16) unless matmuls are float32; each segment is cut into tiles of
  // query rows that the kernels take one per block (and head).
  void segment_attention(const float* q, const float* k, const float* v, int64_t stride, int heads,
                         int head_dim, std::span<const int64_t> starts, float* out) override {
    check(starts.size() >= 2 && starts.front() == 0, "segment_attention: segment starts must begin at 0");
    check(head_dim > 0 && head_dim <= 256, "segment_attention: head_dim {} is not supported on CUDA (≤ 256)",
          head_dim);
    check(starts.back() < (int64_t(1) << 31), "segment_attention: {} rows", starts.back());
    const bool tensor_cores = !fp32_matmul_ && cuda::segment_attention_mma_supported(head_dim);
    const int64_t per_tile = tensor_cores ? cuda::kSegmentTileRowsMma : cuda::kSegmentTileRowsSimt;
    segment_tiles_.clear();
    for (size_t s = 0; s + 1 < starts.size(); ++s) {
      check(starts[s] <= starts[s + 1], "segment_attention: segment starts must not decrease");
      for (int64_t q0 = starts[s]; q0 < starts[s + 1]; q0 += per_tile)
        segment_tiles_.push_back({int32_t(q0), int32_t(std::min(q0 + per_tile, starts[s + 1])),
                                  int32_t(starts[s]), int32_t(starts[s + 1])});
    }
    if (segment_tiles_.empty()) return;
    cuda::SegmentAttentionArgs a;
    a.q = q, a.k = k, a.v = v, a.stride = stride, a.rows = starts.back();
    a.heads = heads, a.head_dim = head_dim;
    a.tiles = static_cast<const cuda::SegmentTile*>(
        stage(segment_tiles_.data(), segment_tiles_.size() * sizeof(cuda::SegmentTile)));
    a.num_tiles = int64_t(segment_tiles_.size());
    a.tensor_cores = tensor_cores;
    a.out = out;
    Buffer scratch;
    if (tensor_cores)
      scratch = allocate((cuda::segment_attention_scratch_bytes(a.rows, heads, head_dim, true) + 3) / 4);
    a.scratch = scratch.get();
    if (auto op = start("segment_attention", q, k, v, stride, a.rows, heads, head_dim, a.tiles, a.num_tiles,
                        tensor_cores, a.scratch, out))
      cuda::launch_segment_attention(a, stream_);
  }

  void matmul_n(const float* x, int64_t n, std::span<const Matrix* const> ws,
                std::span<float* const> ys) override {
    check(ws.size() == ys.size(), "matmul_n: {} matrices but {} outputs", ws.size(), ys.size());
    const size_t count = ws.size();
    if (n >= 1 && n <= kGemvMaxRows && count >= 2 && count <= size_t(cuda::kGemvMaxSegments)) {
      WeightView v[cuda::kGemvMaxSegments];
      std::array<const void*, 2 * cuda::kGemvMaxSegments> args{};
      bool same = true;
      int64_t rows = 0;
      for (size_t i = 0; i < count; ++i) {
        v[i] = weight(*ws[i]);
        same = same && v[i].type == v[0].type && v[i].cols == v[0].cols;
        rows += v[i].rows;
        args[2 * i] = v[i].data, args[2 * i + 1] = ys[i];
      }
      if (same) {
        WeightView all = v[0];
        all.rows = rows;
        bool mma = true;
        for (size_t i = 0; i < count; ++i) mma = mma && small_mma(v[i], x, n, /*any_rows=*/true);
        if (mma) {
          auto scratch = allocate((cuda::gemm_mma_scratch_bytes(n, v[0].cols) + 3) / 4);
          if (auto op = start(matmul_label(all), x, n, args, scratch.get()))
            cuda::launch_gemm_mma(x, n, v, ys.data(), int(count), scratch.get(), stream_);
          return;
        }
        if (auto op = start(matmul_label(all), x, n, args))
          cuda::launch_gemv_multi(x, n, v, ys.data(), int(count), stream_);
        return;
      }
      // Mixed dtypes (an FP8 checkpoint's GDN projections: qkv and z FP8, b and a bf16). A decode step waits
      // on each launch in turn (FP8 decode batch 1: 2.97 ms a step with a launch per matrix there, 2.66 with
      // one per dtype), so where the FP8 matrices take the MMA kernel the bf16 ones ride in the same launch,
      // at any row count: float32-accurate like the GEMV (three-term x).
      bool one_launch = mixed_mma_enabled();
      bool any_fp8 = false;
      for (size_t i = 0; i < count && one_launch; ++i) {
        any_fp8 = any_fp8 || v[i].type == WType::FP8;
        one_launch = v[i].cols == v[0].cols &&
                     (v[i].type == WType::FP8
                          ? small_mma(v[i], x, n, /*any_rows=*/true)
                          : v[i].type == WType::BF16 && !fp32_matmul_ && cuda::gemm_mma_supported(v[i]));
      }
      if (one_launch && any_fp8) {
        WeightView all = v[0];
        all.rows = rows;
        auto scratch = allocate((cuda::gemm_mma_scratch_bytes(n, v[0].cols) + 3) / 4);
        if (auto op = start(matmul_label(all), x, n, args, scratch.get()))
          cuda::launch_gemm_mma(x, n, v, ys.data(), int(count), scratch.get(), stream_);
        return;
      }
      std::vector<const Matrix*> group_w;
      std::vector<float*> group_y;
      std::vector<bool> done(count, false);
      for (size_t i = 0; i < count; ++i) {
        if (done[i]) continue;
        group_w.clear(), group_y.clear();
        for (size_t j = i; j < count; ++j)
          if (!done[j] && v[j].type == v[i].type && v[j].cols == v[i].cols) {
            group_w.push_back(ws[j]), group_y.push_back(ys[j]);
            done[j] = true;
          }
        if (group_w.size() == 1)
          matmul(x, n, *group_w[0], group_y[0]);
        else
          matmul_n(x, n, group_w, group_y);
      }
      return;
    }
    // Prefill: the matrices that go to cuBLAS with bf16 weights (the GDN's qkv and z, attention's q, k and v)
    // share one rounding of x to bf16, a pass over x each fewer.
    if (n > kGemvMaxRows && count >= 2) {
      std::vector<WeightView> v(count);
      size_t shared = 0;
      for (size_t i = 0; i < count; ++i) {
        v[i] = weight(*ws[i]);
        shared += bf16_cublas(v[i], n) && v[i].cols == v[0].cols;
      }
      if (shared >= 2) {
        auto xb = allocate(size_t((n * v[0].cols + 1) / 2));
        auto* xh = reinterpret_cast<uint16_t*>(xb.get());
        if (auto op = start("to_bf16", x, n, v[0].cols, xh))
          cuda::launch_to_bf16(x, xh, n * v[0].cols, stream_);
        for (size_t i = 0; i < count; ++i) {
          if (bf16_cublas(v[i], n) && v[i].cols == v[0].cols) {
            if (auto op = start(matmul_label(v[i]), xh, n, v[i].data, ys[i]))
              gemm_bf16(v[i].data, v[i], xh, n, ys[i]);
          } else {
            matmul(x, n, *ws[i], ys[i]);
          }
        }
        return;
      }
    }
    Backend::matmul_n(x, n, ws, ys);
  }

  // Two launches for the whole batch; the state pointers are staged inputs, so a recorded step stays valid
  // when the batch's sequences move to other slots.
  void gdn_decode(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b, const float* a,
                  int64_t n, const float* conv_w, int kernel, const float* a_log, const float* dt_bias,
                  const float* norm_w, float eps, std::span<float* const> conv_states,
                  std::span<float* const> states, float* out) override {
    if (!cuda::gdn_decode_supported(s.k_dim, s.v_dim, kernel) || s.k_heads <= 0 ||
        s.v_heads % s.k_heads != 0) {
      Backend::gdn_decode(s, qkv, z, b, a, n, conv_w, kernel, a_log, dt_bias, norm_w, eps, conv_states,
                          states, out);
      return;
    }
    check(int64_t(conv_states.size()) == n && int64_t(states.size()) == n && n > 0,
          "gdn_decode: {} sequences, {} states", n, states.size());
    const cuda::StateType st = cache_state_type(states[0], "gated delta rule state");
    for (int64_t i = 0; i < n; ++i)
      check(cache_state_type(conv_states[size_t(i)], "causal conv state") == st &&
                cache_state_type(states[size_t(i)], "gated delta rule state") == st,
            "gdn_decode: the batch's state slots differ in dtype");
    // Slots of one pool lie at multiples of a slot's size from its start, so a recorded step's replays keep
    // the alignment seen here.
    const bool aligned = std::all_of(states.begin(), states.end(),
                                     [](float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; });
    const int64_t C = 2 * int64_t(s.k_heads) * s.k_dim + int64_t(s.v_heads) * s.v_dim;
    const float* cw = vec(conv_w, size_t(C * kernel));
    const float* al = vec(a_log, size_t(s.v_heads));
    const float* dt = vec(dt_bias, size_t(s.v_heads));
    const float* nw = vec(norm_w, size_t(s.v_dim));
    const auto* cs = static_cast<void* const*>(stage(conv_states.data(), conv_states.size_bytes()));
    const auto* rs = static_cast<void* const*>(stage(states.data(), states.size_bytes()));
    auto conv = allocate(size_t(n * C));
    if (auto op = start("gdn_decode", qkv, z, b, a, n, cw, kernel, al, dt, nw, eps, cs, rs, aligned,
                        conv.get(), out, s.k_heads, s.v_heads, s.k_dim, s.v_dim))
      cuda::launch_gdn_decode(qkv, z, b, a, n, s.k_heads, s.k_dim, s.v_heads, s.v_dim, cw, kernel, al, dt, nw,
                              eps, cs, rs, st, aligned, conv.get(), out, stream_);
  }

  // Verify steps: every sequence's tokens in one conv and one delta-rule launch (the state in registers
  // across a sequence's tokens), instead of a gdn_decode and two state copies per token.
  void gdn_verify(const DeltaRuleShape& s, const float* qkv, const float* z, const float* b, const float* a,
                  std::span<const int64_t> first_rows, std::span<const int64_t> lengths, const float* conv_w,
                  int kernel, const float* a_log, const float* dt_bias, const float* norm_w, float eps,
                  std::span<float* const> conv_states, std::span<float* const> states,
                  std::span<float* const> conv_trails, std::span<float* const> trails, float* out) override {
    const size_t n = first_rows.size();
    check(n > 0 && lengths.size() == n && conv_states.size() == n && states.size() == n,
          "gdn_verify: {} sequences, {} lengths, {} states", n, lengths.size(), states.size());
    const cuda::StateType st = cache_state_type(states[0], "gated delta rule state");
    if (!cuda::gdn_decode_supported(s.k_dim, s.v_dim, kernel) || s.k_heads <= 0 ||
        s.v_heads % s.k_heads != 0) {
      // The composed default copies trail states as float32 values.
      check(st == cuda::StateType::F32, "gdn_verify: bf16 state slots need k_dim, v_dim ≤ 128");
      Backend::gdn_verify(s, qkv, z, b, a, first_rows, lengths, conv_w, kernel, a_log, dt_bias, norm_w, eps,
                          conv_states, states, conv_trails, trails, out);
      return;
    }
    int64_t rows = 0, trail_count = 0;
    for (size_t i = 0; i < n; ++i) {
      check(lengths[i] >= 1, "gdn_verify: a sequence of {} tokens", lengths[i]);
      rows = std::max(rows, first_rows[i] + lengths[i]);
      trail_count += lengths[i] - 1;
    }
    check(int64_t(conv_trails.size()) == trail_count && int64_t(trails.size()) == trail_count,
          "gdn_verify: {} trail states for {} tokens after the first", trails.size(), trail_count);
    for (auto list : {conv_states, states, conv_trails, trails})
      for (float* p : list)
        check(cache_state_type(p, "gated delta rule state") == st,
              "gdn_verify: the state slots differ in dtype");
    const int64_t C = 2 * int64_t(s.k_heads) * s.k_dim + int64_t(s.v_heads) * s.v_dim;
    const float* cw = vec(conv_w, size_t(C * kernel));
    const float* al = vec(a_log, size_t(s.v_heads));
    const float* dt = vec(dt_bias, size_t(s.v_heads));
    const float* nw = vec(norm_w, size_t(s.v_dim));
    const auto* fr = static_cast<const int64_t*>(stage(first_rows.data(), first_rows.size_bytes()));
    const auto* ln = static_cast<const int64_t*>(stage(lengths.data(), lengths.size_bytes()));
    const auto* cs = static_cast<void* const*>(stage(conv_states.data(), conv_states.size_bytes()));
    const auto* rs = static_cast<void* const*>(stage(states.data(), states.size_bytes()));
    // Sequences of one token keep no trail: a batch of only those has no trail arrays to read.
    const auto* ct = trail_count
                         ? static_cast<void* const*>(stage(conv_trails.data(), conv_trails.size_bytes()))
                         : nullptr;
    const auto* ts =
        trail_count ? static_cast<void* const*>(stage(trails.data(), trails.size_bytes())) : nullptr;
    auto conv = allocate(size_t(rows * C));
    if (auto op = start("gdn_verify", qkv, z, b, a, int64_t(n), fr, ln, cw, kernel, al, dt, nw, eps, cs, rs,
                        ct, ts, conv.get(), out, s.k_heads, s.v_heads, s.k_dim, s.v_dim))
      cuda::launch_gdn_verify(qkv, z, b, a, int64_t(n), fr, ln, s.k_heads, s.k_dim, s.v_heads, s.v_dim, cw,
                              kernel, al, dt, nw, eps, cs, rs, ct, ts, st, conv.get(), out, stream_);
  }

  // Decode-sized batches: router and shared-expert gate in one GEMV, then routing, the gate/up of every pair
  // and of the shared expert, and the down projections with the combine (launch_moe_decode): 4 launches.
  void moe_block(const Matrix& router, std::span<const SwiGlu> experts, int top_k, bool renormalize,
                 const SwiGlu* shared, const Matrix* shared_gate, const float* x, int64_t n, int64_t hidden,
                 float* out) override {
    const auto& table = expert_table(experts);
    const WeightView r = weight(router);
    cuda::MoeDecodeShared sh;
    WeightView sgv;
    bool fast = n >= 1 && n <= kGemvMaxRows && top_k >= 1 && top_k <= table.experts &&
                table.hidden == hidden && r.rows == table.experts && r.cols == hidden;
    if (fast && shared) {
      check(shared_gate != nullptr, "moe: a shared expert without its gate");
      sh.gate = weight(shared->gate), sh.up = weight(shared->up), sh.down = weight(shared->down);
      sgv = weight(*shared_gate);
      fast = sgv.type == r.type && sgv.rows == 1 && sgv.cols == hidden;
    }
    if (!fast || !cuda::moe_decode_supported(table, top_k, sh)) {
      Backend::moe_block(router, experts, top_k, renormalize, shared, shared_gate, x, n, hidden, out);
      return;
    }
    const int64_t P = n * top_k;
    auto logits = allocate(size_t(n * table.experts)), gate_logit = allocate(size_t(n));
    auto ids = allocate(size_t(P)), weights = allocate(size_t(P));  // int32 and float share a size
    auto h = allocate(size_t(P * table.inter));
    auto hs = allocate(size_t(shared ? n * sh.gate.rows : 1));
    cuda::MoeScratch s;
    s.ids = reinterpret_cast<int32_t*>(ids.get());
    s.weights = weights.get();
    s.h = h.get();
    sh.gate_logit = gate_logit.get();
    sh.h = hs.get();
    if (auto op = start("moe_block", x, n, top_k, renormalize, out, r.data, sh.down.data, table.gate,
                        logits.get(), s.ids, s.h, sh.h)) {
      const WeightView ws[2] = {r, sgv};
      float* const ys[2] = {logits.get(), gate_logit.get()};
      cuda::launch_gemv_multi(x, n, ws, ys, shared ? 2 : 1, stream_);
      cuda::launch_moe_decode(table, logits.get(), top_k, renormalize, x, n, sh, s, out, stream_);
    }
  }

  void argmax(const float* x, int64_t rows, int64_t cols, int32_t* out_host) override {
    auto ids = allocate(size_t(rows));
    if (auto op = start("argmax", x, rows, cols, ids.get()))
      cuda::launch_argmax(x, rows, cols, reinterpret_cast<int32_t*>(ids.get()), stream_);
    download_bytes(ids.get(), out_host, size_t(rows) * sizeof(int32_t));
  }

  void logits_topk(const float* x, int64_t rows, int64_t cols, std::span<const float> temperatures, int k,
                   float* out) override {
    check(k >= 1 && k <= kMaxLogitsTopk && int64_t(temperatures.size()) == rows,
          "logits_topk: k {} (1..{}), {} temperatures for {} rows", k, kMaxLogitsTopk, temperatures.size(),
          rows);
    if (rows == 0) return;
    const void* temps = stage(temperatures.data(), temperatures.size_bytes());
    auto scratch = allocate((cuda::logits_topk_scratch_bytes(rows, cols, k) + 3) / 4);
    if (auto op = start("logits_topk", x, rows, cols, temps, k, scratch.get(), out))
      cuda::launch_logits_topk(x, rows, cols, static_cast<const float*>(temps), k, scratch.get(), out,
                               stream_);
  }

  // ---- tools -------------------------------------------------------------------------------------------
  void* allocate_device(size_t bytes) { return weights_arena_.allocate(bytes); }
  void fill_random(void* data, DType dtype, int64_t n, uint64_t seed, float scale) {
    cuda::launch_fill_random(data, wtype(dtype), n, seed, scale, stream_);
    CUDA_OK(cudaGetLastError());
  }
  void synchronize() { CUDA_OK(cudaStreamSynchronize(stream_)); }
  void set_profiling(bool on) {
    synchronize();
    profiling_ = on;
  }
  void reset_profile() { profile_.clear(); }
  void set_graphs(bool on) { graphs_enabled_ = on; }
  std::string profile_report() const {
    std::vector<std::pair<std::string, ProfileEntry>> rows(profile_.begin(), profile_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::string s =
        fmt::format("{:<34} {:>8} {:>10} {:>9} {:>6}\n", "op", "calls", "total ms", "us/call", "%");
    for (const auto& [name, e] : rows)
      s += fmt::format("{:<34} {:>8} {:>10.3f} {:>9.1f} {:>5.1f}%\n", name, e.calls, e.ms,
                       1000 * e.ms / e.calls, 100 * e.ms / total);
    s += fmt::format("{:<34} {:>8} {:>10.3f}\n", "total", "", total);
    return s;
  }
  std::string graph_timing() {
    std::string s = fmt::format(
        "{} graph replays: host fill {:.1f} us, launch + run + sync {:.1f} us per replay; {} nodes in "
        "the last recording",
        replays_, replays_ ? 1e6 * fill_seconds_ / replays_ : 0.0,
        replays_ ? 1e6 * launch_seconds_ / replays_ : 0.0, counts_.last_nodes);
    replays_ = 0;
    fill_seconds_ = launch_seconds_ = 0;
    return s;
  }
  cuda_tools::GraphCounts graph_counts() const { return counts_; }
  std::string device_summary() const {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return fmt::format(
        "{} (sm_{}{}, {} SMs, {:.1f} GiB; {:.1f} GiB in use: weights {:.1f}, activations {:.1f})",
        props_.name, props_.major, props_.minor, props_.multiProcessorCount, total_b / 1073741824.0,
        (total_b - free_b) / 1073741824.0, weights_arena_.total() / 1073741824.0,
        pool_.held_bytes() / 1073741824.0);
  }

 private:
  static constexpr size_t kCublasWorkspace = size_t(32) << 20;

  // ---- op scopes: signature, eager error checks and profiling ------------------------------------------
  class OpScope {
   public:
    OpScope(CudaBackend* be, const char* name, bool issue, bool timed)
        : be_(be), name_(name), issue_(issue), timed_(timed) {
      ++be_->depth_;
      if (timed_) CUDA_OK(cudaEventRecord(be_->ev_start_, be_->stream_));
    }
    OpScope(const OpScope&) = delete;
    ~OpScope() noexcept(false) {
      --be_->depth_;
      if (!issue_ || std::uncaught_exceptions()) return;
      if (be_->mode_ == Mode::Eager || be_->mode_ == Mode::Measure) {
        CUDA_OK(cudaGetLastError());
        if (be_->sync_each_op_) {
          const cudaError_t e = cudaStreamSynchronize(be_->stream_);
          if (e != cudaSuccess)
            fail("CUDA error {} in op {}: {}", cudaGetErrorName(e), name_, cudaGetErrorString(e));
        }
      }
      if (timed_) {
        CUDA_OK(cudaEventRecord(be_->ev_stop_, be_->stream_));
        CUDA_OK(cudaEventSynchronize(be_->ev_stop_));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, be_->ev_start_, be_->ev_stop_));
        auto& e = be_->profile_[name_];
        e.calls += 1;
        e.ms += ms;
      }
    }
    explicit operator bool() const { return issue_; }

   private:
    CudaBackend* be_;
    const char* name_;
    bool issue_, timed_;
  };

  template <typename... Args>
  OpScope start(const char* name, const Args&... statics) {
    if (mode_ == Mode::Capture || mode_ == Mode::Fill) {
      fold(name);
      (fold(statics), ...);
    }
    // A recording that already went wrong issues nothing more (it is discarded and the step rerun).
    const bool issue = mode_ != Mode::Fill && !(mode_ == Mode::Capture && step_failed_);
    const bool timed = issue && profiling_ && depth_ == 0;
    return OpScope(this, name, issue, timed);
  }

  // Whether cuBLASLt has a block-scaled FP8 GEMM for this shape; says once when it has none, since the
  // fallback (weights widened to bf16) moves 5 bytes per weight and FP8 prefill then gains nothing. On the
  // H200 with CUDA 13 the heuristic finds none (docs/cuda.md); with placeholder scale pointers set before
  // asking it found algorithms, but their results were wrong at 1024x2048 (200 and 1,000 rows).
  bool fp8_lt_supports(const WeightView& v, int64_t n) {
    if (fp8_lt_->supports(v, n)) return true;
    static bool said = false;
    if (!said) {
      said = true;
      spdlog::warn(
          "cuBLASLt has no block-scaled FP8 GEMM for {}x{} at {} rows: FP8 prefill matmuls widen the "
          "weights to bf16",
          v.rows, v.cols, n);
    }
    return false;
  }

  // Whether an n-row matmul over v takes the small-batch tensor-core kernels (launch_gemm_mma): FP8 at
  // fp8_mma_min_rows()..fp8_mma_max_rows(), bf16 at 3..8 (kBf16MmaTallRows). Matrices of few rows (router,
  // gates, GDN b/a) keep float32 activations from 9 rows; up to 8 the path is as exact as the GEMV, so
  // matmul_n's segments may be small (any_rows).
  bool small_mma(const WeightView& v, const float* x, int64_t n, bool any_rows = false) const {
    if (fp32_matmul_) return false;
    if (v.type == WType::FP8) {
      if (n < fp8_mma_min_rows() || n > fp8_mma_max_rows()) return false;
    } else if (v.type != WType::BF16 || !bf16_mma_enabled() || n < 3 || n > kGemvMaxRows ||
               (n <= 4 && v.rows > kBf16MmaTallRows)) {
      return false;
    }
    if (n > kGemvMaxRows && v.rows < kTensorCoreMinRows) return false;
    if (!any_rows && n <= kGemvMaxRows && v.rows < kTensorCoreMinRows) return false;
    return cuda::gemm_mma_supported(v) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  }

  // "matmul ROWSxCOLS" for the profile (stable storage, so the op name can be a const char*).
  const char* matmul_label(const WeightView& v) {
    if (!profiling_) return "matmul";
    auto& label = matmul_labels_[{v.rows, v.cols}];
    if (label.empty()) label = fmt::format("matmul {}x{}", v.rows, v.cols);
    return label.c_str();
  }

  template <typename T>
  void fold(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    for (unsigned char b : bytes) signature_ = (signature_ ^ b) * 0x100000001b3ull;
  }
  void fold(const char* s) {
    for (; *s; ++s) signature_ = (signature_ ^ uint8_t(*s)) * 0x100000001b3ull;
  }

  // ---- host inputs staged for the device ---------------------------------------------------------------
  const void* stage(const void* data, size_t bytes) {
    const size_t size = align_up(std::max<size_t>(bytes, 1), 16);
    if (mode_ == Mode::Eager || mode_ == Mode::Measure) {
      if (graph_) graph_->dyn_bytes += size;
      if (eager_.used + size > eager_.capacity) {
        CUDA_OK(cudaStreamSynchronize(stream_));  // every earlier copy out of the ring has run
        if (size > eager_.capacity) eager_.reserve(std::max(size, 2 * eager_.capacity));
        eager_.used = 0;
      }
      char* h = eager_.host + eager_.used;
      char* d = eager_.dev + eager_.used;
      std::memcpy(h, data, bytes);
      eager_.used += size;
      CUDA_OK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
      return d;
    }
    StagingArena& a = graph_->arena;
    if (a.used + size > a.capacity) {
      step_failed_ = true;  // the step stages more than when it was measured; nothing more is issued
      return nullptr;
    }
    std::memcpy(a.host + a.used, data, bytes);
    const void* d = a.dev + a.used;
    a.used += size;
    return d;
  }

  void download_bytes(const void* src, void* host, size_t bytes) {
    if (mode_ == Mode::Eager || mode_ == Mode::Measure) {
      if (mode_ == Mode::Measure) graph_->download_sizes.push_back(bytes);
      if (auto op = start("download", src, bytes)) {
        CUDA_OK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA_OK(cudaStreamSynchronize(stream_));
      }
      return;
    }
    const size_t i = downloads_seen_++;
    if (i >= graph_->staging.size() || graph_->staging[i].bytes != bytes) {
      step_failed_ = true;
      return;
    }
    void* pinned = graph_->staging[i].host;
    if (auto op = start("download", src, bytes))
      CUDA_OK(cudaMemcpyAsync(pinned, src, bytes, cudaMemcpyDeviceToHost, stream_));
    deferred_.push_back({host, pinned, bytes});
  }

  void* replay_allocation(size_t bytes) {
    StepGraph& g = *graph_;
    if (g.replay_at >= g.allocations.size() || g.allocations[g.replay_at].second != bytes) {
      step_failed_ = true;
      return g.allocations.empty() ? nullptr : g.allocations.front().first;
    }
    return g.allocations[g.replay_at++].first;
  }

  // ---- step recording ----------------------------------------------------------------------------------
  void measure(StepGraph& g, const std::function<void()>& step) {
    g.reset();
    g.dyn_bytes = 0;
    graph_ = &g;
    mode_ = Mode::Measure;
    try {
      step();
    } catch (...) {
      mode_ = Mode::Eager;
      graph_ = nullptr;
      throw;
    }
    mode_ = Mode::Eager;
    graph_ = nullptr;
    g.arena.reserve(g.dyn_bytes);
    for (size_t bytes : g.download_sizes) {
      PinnedBuffer b;
      b.bytes = bytes;
      CUDA_OK(cudaMallocHost(&b.host, bytes));
      g.staging.push_back(b);
    }
    g.state = StepGraph::State::Seen;
  }

  void begin_graph_mode(StepGraph& g, Mode mode) {
    graph_ = &g;
    mode_ = mode;
    signature_ = 0xcbf29ce484222325ull;
    step_failed_ = false;
    downloads_seen_ = 0;
    deferred_.clear();
    g.arena.used = 0;
    g.replay_at = 0;
  }
  void end_graph_mode() {
    mode_ = Mode::Eager;
    graph_ = nullptr;
  }

  void capture(StepGraph& g, const std::function<void()>& step) {
    CUDA_OK(cudaStreamSynchronize(stream_));
    g.allocations.clear();
    begin_graph_mode(g, Mode::Capture);
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
      // First node: this step's staged host inputs, copied when the graph runs.
      CUDA_OK(cudaMemcpyAsync(g.arena.dev, g.arena.host, g.arena.capacity, cudaMemcpyHostToDevice, stream_));
      step();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      end_graph_mode();
      g.state = StepGraph::State::Disabled;
      throw;
    }
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    end_graph_mode();
    if (ended != cudaSuccess || step_failed_ || !graph ||
        cudaGraphInstantiate(&g.exec, graph, 0) != cudaSuccess) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      give_up(g);
      step();
      return;
    }
    size_t nodes = 0;
    if (cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess) counts_.last_nodes = int64_t(nodes);
    cudaGraphDestroy(graph);
    g.signature = signature_;
    g.state = StepGraph::State::Ready;
    ++counts_.recordings;
    launch(g);
  }

  void replay(StepGraph& g, const std::function<void()>& step) {
    const auto t0 = std::chrono::steady_clock::now();
    begin_graph_mode(g, Mode::Fill);
    try {
      step();
    } catch (...) {
      end_graph_mode();
      throw;
    }
    end_graph_mode();
    fill_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step_failed_ || signature_ != g.signature || g.replay_at != g.allocations.size() ||
        downloads_seen_ != g.staging.size()) {
      // Something the recording baked in changed (another cache, batch composition): record afresh on the
      // next call and run this one directly; a key that keeps changing stops being recorded.
      if (++g.failures > 3) {
        g.reset();
        g.state = StepGraph::State::Disabled;
      } else {
        g.state = StepGraph::State::Fresh;
      }
      deferred_.clear();
      step();
      return;
    }
    g.failures = 0;
    const auto t1 = std::chrono::steady_clock::now();
    launch(g);
    launch_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    ++replays_;
    ++counts_.replays;
  }

  void launch(StepGraph& g) {
    CUDA_OK(cudaGraphLaunch(g.exec, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    for (const auto& d : deferred_) std::memcpy(d.host, d.pinned, d.bytes);
    deferred_.clear();
  }

  void give_up(StepGraph& g) {
    g.reset();
    g.state = ++g.failures > 3 ? StepGraph::State::Disabled : StepGraph::State::Fresh;
  }

  // ---- weights -----------------------------------------------------------------------------------------
  WeightView weight(const Matrix& w) {
    check(!w.empty(), "a weight matrix is missing");
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return it->second;
    WeightView v;
    v.type = wtype(w.dtype);
    v.rows = w.rows, v.cols = w.cols;
    v.block_rows = w.block_rows, v.block_cols = w.block_cols;
    v.scale_cols = w.scale_cols();
    check(v.type != WType::FP8 || (w.scale_inv && w.block_rows > 0 && w.block_cols > 0),
          "an FP8 weight [{} x {}] has no block scales", w.rows, w.cols);
    const size_t scale_floats =
        w.scale_inv ? size_t((w.rows + w.block_rows - 1) / w.block_rows * v.scale_cols) : 0;
    if (is_device_pointer(w.data)) {
      v.data = w.data;
      v.scale_inv = w.scale_inv;
      if (w.scale_inv && !is_device_pointer(w.scale_inv))
        v.scale_inv = upload_floats(w.scale_inv, scale_floats);
    } else {
      const size_t bytes = size_t(w.rows) * size_t(w.cols) * dtype_size(w.dtype);
      void* d = weights_arena_.allocate(bytes);
      copy_in(d, w.data, bytes);
      v.data = d;
      if (w.scale_inv) v.scale_inv = upload_floats(w.scale_inv, scale_floats);
    }
    weights_.emplace(w.data, v);
    return v;
  }

  // A float32 copy of a matrix of few outputs for cuBLAS's SGEMM, made on its first use by n rows at or above
  // small_sgemm_min_rows(); nullptr when that path is off. A step being recorded or refilled makes no copy
  // (it would be a node of the graph): it uses one made by an earlier eager step, or streams the weights,
  // and the op's signature tells a replay which of the two was recorded.
  bool split_gemm(const WeightView& v, int64_t n) const {
    const int64_t min_rows = split_gemm_min_rows();
    return !fp32_matmul_ && v.type == WType::BF16 && min_rows > 0 && n >= min_rows &&
           v.rows >= kSplitGemmMinOutputs && v.rows < kTensorCoreMinRows && v.cols % 8 == 0;
  }

  const float* widened_f32(const WeightView& v, int64_t n) {
    const int64_t min_rows = small_sgemm_min_rows();
    if (min_rows <= 0 || n < min_rows || v.rows >= kTensorCoreMinRows) return nullptr;
    auto it = widened_.find(v.data);
    if (it != widened_.end()) return it->second;
    if (mode_ == Mode::Capture || mode_ == Mode::Fill) return nullptr;
    auto* f = static_cast<float*>(weights_arena_.allocate(size_t(v.rows * v.cols) * sizeof(float)));
    cuda::launch_dequant_f32(v, f, stream_);
    widened_.emplace(v.data, f);
    return f;
  }

  const float* upload_floats(const float* host, size_t n) {
    void* d = weights_arena_.allocate(n * sizeof(float));
    copy_in(d, host, n * sizeof(float));
    return static_cast<const float*>(d);
  }

  // A synchronous host-to-device copy ordered with the stream. (A plain cudaMemcpy from pageable memory may
  // return before its DMA lands, and the legacy stream it uses does not order with ours.)
  void copy_in(void* dst, const void* host, size_t bytes) {
    CUDA_OK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
  }

  // A weight vector (norm weights, gates, conv taps, RoPE frequencies) in device memory.
  const float* vec(const float* p, size_t n) {
    auto it = vectors_.find(p);
    if (it != vectors_.end()) return it->second;
    const float* d = is_device_pointer(p) ? p : upload_floats(p, n);
    vectors_.emplace(p, d);
    return d;
  }

  const cuda::ExpertTable& expert_table(std::span<const SwiGlu> experts) {
    check(!experts.empty(), "moe: no experts");
    auto it = expert_tables_.find(experts.data());
    if (it != expert_tables_.end() && it->second.count == experts.size() &&
        it->second.first_gate == experts.front().gate.data &&
        it->second.last_down == experts.back().down.data)
      return it->second.table;
    const size_t E = experts.size();
    check(E <= 512, "moe: {} experts; the CUDA backend takes at most 512", E);
    std::vector<const void*> ptrs(6 * E);
    cuda::ExpertTable t;
    bool scaled = false;
    for (size_t e = 0; e < E; ++e) {
      const WeightView g = weight(experts[e].gate), u = weight(experts[e].up), d = weight(experts[e].down);
      if (e == 0) {
        t.type = g.type, t.hidden = g.cols, t.inter = g.rows;
        t.block_rows = g.block_rows, t.block_cols = g.block_cols;
        scaled = g.scale_inv != nullptr;
      }
      for (const WeightView* m : {&g, &u, &d})
        check(m->type == t.type && m->block_rows == t.block_rows && m->block_cols == t.block_cols,
              "moe: experts mix weight types or scale blocks");
      check(g.rows == t.inter && u.rows == t.inter && g.cols == t.hidden && u.cols == t.hidden &&
                d.rows == t.hidden && d.cols == t.inter,
            "moe: expert {} has a different shape", e);
      ptrs[e] = g.data, ptrs[E + e] = u.data, ptrs[2 * E + e] = d.data;
      ptrs[3 * E + e] = g.scale_inv, ptrs[4 * E + e] = u.scale_inv, ptrs[5 * E + e] = d.scale_inv;
    }
    auto* dev = static_cast<const void**>(weights_arena_.allocate(ptrs.size() * sizeof(void*)));
    copy_in(dev, ptrs.data(), ptrs.size() * sizeof(void*));
    t.experts = int(E);
    t.gate = dev, t.up = dev + E, t.down = dev + 2 * E;
    if (scaled) {
      t.gate_scale = reinterpret_cast<const float* const*>(dev + 3 * E);
      t.up_scale = reinterpret_cast<const float* const*>(dev + 4 * E);
      t.down_scale = reinterpret_cast<const float* const*>(dev + 5 * E);
    }
    auto& entry = expert_tables_[experts.data()];
    entry.table = t;
    entry.count = E;
    entry.first_gate = experts.front().gate.data, entry.last_down = experts.back().down.data;
    return entry.table;
  }

  struct CacheRange {
    size_t bytes = 0;
    bool bf16 = false;  // GDN state stored as bf16
  };
  // The cache allocation holding p (which must be one); for GDN state, how it stores its values.
  const CacheRange& cache_range(const void* p, const char* what) {
    auto it = caches_.upper_bound(static_cast<const char*>(p));
    const bool inside = it != caches_.begin() && [&] {
      --it;
      return static_cast<const char*>(p) < it->first + it->second.bytes;
    }();
    check(inside,
          "{}: not in this GPU's cache memory (size the cache with the model's state_cache_spec(), "
          "which asks the backend for its cache memory)",
          what);
    return it->second;
  }
  cuda::StateType cache_state_type(const float* p, const char* what) {
    return cache_range(p, what).bf16 ? cuda::StateType::BF16 : cuda::StateType::F32;
  }

  struct Deferred {
    void* host;
    const void* pinned;
    size_t bytes;
  };

  bool fp32_matmul_ = false;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  std::unique_ptr<cuda::Fp8LtGemm> fp8_lt_;  // shares cuBLAS's workspace (one stream)
  DevicePool pool_;
  DeviceArena weights_arena_;
  StagingArena eager_;
  std::unordered_map<const void*, WeightView> weights_;
  std::unordered_map<const void*, const float*> vectors_;
  std::unordered_map<const void*, const float*> widened_;  // float32 copies of few-output matrices
  std::unordered_map<const void*, ExpertTableEntry> expert_tables_;
  std::map<const char*, CacheRange> caches_;  // cache allocations by base address

  Mode mode_ = Mode::Eager;
  StepGraph* graph_ = nullptr;
  std::unordered_map<uint64_t, std::unique_ptr<StepGraph>> graphs_;
  bool graphs_enabled_ = true;
  uint64_t signature_ = 0;
  bool step_failed_ = false;
  size_t downloads_seen_ = 0;
  std::vector<Deferred> deferred_;
  std::vector<int32_t> decode_pages_;             // attention_decode's padded page tables, before staging
  std::vector<int64_t> decode_rope_;              // attention_decode's rope positions, before staging
  std::vector<cuda::SegmentTile> segment_tiles_;  // segment_attention's tiles, before staging

  int64_t replays_ = 0;
  cuda_tools::GraphCounts counts_;  // since the backend was made
  double fill_seconds_ = 0, launch_seconds_ = 0;

  int depth_ = 0;
  bool sync_each_op_ = false;
  bool profiling_ = false;
  std::map<std::pair<int64_t, int64_t>, std::string> matmul_labels_;
  cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
  // The cuBLAS experts' plan on the host: its item count, then ≤ 513 items of (expert, first row, rows) (at
  // most 512 experts, expert_table), copied when the event after the copy fires.
  static constexpr size_t kMoePlanHostInts = 1 + 3 * 513;
  int32_t* moe_plan_host_ = nullptr;
  cudaEvent_t moe_plan_ready_ = nullptr;
  std::unordered_map<std::string, ProfileEntry> profile_;
};

CudaBackend& cuda_of(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  check(c != nullptr, "not a CUDA backend");
  return *c;
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

namespace cuda_tools {
void* allocate_device(Backend& b, size_t bytes) {
  return cuda_of(b).allocate_device(bytes);
}
void fill_random(Backend& b, void* data, DType dtype, int64_t n, uint64_t seed, float scale) {
  cuda_of(b).fill_random(data, dtype, n, seed, scale);
}
void synchronize(Backend& b) {
  cuda_of(b).synchronize();
}
void set_profiling(Backend& b, bool on) {
  cuda_of(b).set_profiling(on);
}
std::string profile_report(Backend& b) {
  return cuda_of(b).profile_report();
}
void reset_profile(Backend& b) {
  cuda_of(b).reset_profile();
}
int64_t moe_tensor_core_min_pairs(DType weights, int64_t hidden, int64_t inter) {
  cuda::ExpertTable t;
  t.type = weights == DType::F8_E4M3 ? cuda::WType::FP8 : cuda::WType::BF16;
  t.hidden = hidden, t.inter = inter;
  if (weights == DType::F8_E4M3) t.block_rows = t.block_cols = 128;
  return cuda::moe_grouped_min_pairs(t);
}

void set_graphs(Backend& b, bool on) {
  cuda_of(b).set_graphs(on);
}
std::string device_summary(Backend& b) {
  return cuda_of(b).device_summary();
}
std::string graph_timing(Backend& b) {
  return cuda_of(b).graph_timing();
}
GraphCounts graph_counts(Backend& b) {
  return cuda_of(b).graph_counts();
}
}  // namespace cuda_tools

}  // namespace moeserve
