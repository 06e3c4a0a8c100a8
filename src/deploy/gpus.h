#pragma once
// What plan and doctor know about each accelerator: compute capability, the CPU architecture of the hosts it
// ships in, memory per GPU, whether that memory is shared with the CPU, and which low-precision formats work.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::deploy {

struct GpuKind {
  std::string key;          // as written in cluster.yaml: gb10, h200, ...
  std::string product;      // what nvidia-smi calls it (substring match)
  int compute_capability;   // 121 = sm_121; 0 = no GPU (CPU backend)
  std::string host_arch;    // aarch64 or x86_64 ("" = either)
  uint64_t memory_bytes;    // per GPU (unified: the whole system memory)
  double memory_bandwidth;  // bytes/s per GPU, the data sheet's (0: unknown); decode is bound by it
  bool unified_memory;      // CPU and GPU share one pool (GB10): the OS and page cache live in the same bytes
  bool fp8;                 // FP8 (E4M3) tensor cores: sm_89 and newer
  bool nvfp4;               // FP4 tensor cores: Blackwell (sm_100, sm_120, sm_121)
  std::string note;         // caveats operators hit
  // serve's tokens per step (--max-num-batched-tokens) on this kind: 8192 where a step of that size stays
  // ~0.1-0.2 s, 2048 where it would stall every running request for ~1 s (docs/engine.md, "Scheduler").
  int step_tokens = 8192;
};

// The table of known kinds; find_gpu matches the key or, case-insensitively, the product name.
const std::vector<GpuKind>& gpu_kinds();
const GpuKind* find_gpu(std::string_view key_or_product);
std::string known_gpu_keys();  // "gb10, h200, ..." for error messages

// "sm_90a" -> {90, true}; "sm_121" -> {121, false}; "121" and "12.1" are accepted too.
struct CudaArch {
  int capability = 0;
  bool arch_specific = false;  // the 'a' suffix: SASS that runs only on exactly this capability
};
CudaArch parse_cuda_arch(std::string_view text);
std::string format_cuda_arch(int capability);  // 121 -> "sm_121"

// Whether code built for `built` runs on a GPU of capability `gpu`: the same capability, or (for portable
// code) the same major version with an older or equal minor one.
bool cuda_arch_runs_on(const CudaArch& built, int gpu);

// Normalises "arm64"/"aarch64" and "amd64"/"x86_64"/"x86-64"; "" when unknown.
std::string normalize_arch(std::string_view arch);
std::string docker_platform(std::string_view arch);  // aarch64 -> linux/arm64

}  // namespace moeserve::deploy
