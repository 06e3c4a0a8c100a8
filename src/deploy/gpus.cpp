#include "deploy/gpus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "deploy/units.h"

namespace moeserve::deploy {

const std::vector<GpuKind>& gpu_kinds() {
  // Memory and its bandwidth are the data sheet's figures per GPU, in decimal bytes (H100: SXM; A100: 80 GB
  // SXM).
  static const std::vector<GpuKind> kinds = {
      {"gb10", "GB10", 121, "aarch64", 128'000'000'000, 273e9, true, true, true,
       "DGX Spark: unified LPDDR5x shared with the OS; x86 images die with 'Illegal instruction'; NVFP4 "
       "kernels built for sm_100 fail with CUDA error 700 (use FP8 or kernels built for sm_121)",
       2048},
      {"h200", "H200", 90, "x86_64", 141'000'000'000, 4.8e12, false, true, false, ""},
      {"h100", "H100", 90, "x86_64", 80'000'000'000, 3.35e12, false, true, false, ""},
      {"gh200", "GH200", 90, "aarch64", 96'000'000'000, 4.0e12, false, true, false,
       "Grace Hopper: aarch64 host"},
      {"b200", "B200", 100, "x86_64", 180'000'000'000, 8.0e12, false, true, true, ""},
      {"gb200", "GB200", 100, "aarch64", 186'000'000'000, 8.0e12, false, true, true,
       "Grace Blackwell: aarch64 host"},
      {"rtx-pro-6000", "RTX PRO 6000", 120, "x86_64", 96'000'000'000, 1.792e12, false, true, true, ""},
      {"l40s", "L40S", 89, "x86_64", 48'000'000'000, 864e9, false, true, false, ""},
      {"a100", "A100", 80, "x86_64", 80'000'000'000, 2.039e12, false, false, false,
       "no FP8 tensor cores: serve BF16"},
      {"cpu", "", 0, "", 0, 0, false, false, false, "CPU backend: correct but slow; memory is the node's RAM",
       2048},
  };
  return kinds;
}

const GpuKind* find_gpu(std::string_view key_or_product) {
  std::string want = ascii_lower(key_or_product);
  for (const auto& k : gpu_kinds())
    if (k.key == want) return &k;
  // Product names: the longest match wins ("GH200" must not resolve to "H200").
  const GpuKind* best = nullptr;
  for (const auto& k : gpu_kinds()) {
    if (k.product.empty()) continue;
    if (want.find(ascii_lower(k.product)) != std::string::npos &&
        (!best || k.product.size() > best->product.size()))
      best = &k;
  }
  return best;
}

std::string known_gpu_keys() {
  std::string out;
  for (const auto& k : gpu_kinds()) out += (out.empty() ? "" : ", ") + k.key;
  return out;
}

CudaArch parse_cuda_arch(std::string_view text) {
  std::string s = ascii_lower(text);
  if (s.starts_with("sm_"))
    s = s.substr(3);
  else if (s.starts_with("compute_"))
    s = s.substr(8);
  CudaArch arch;
  if (!s.empty() && s.back() == 'a') {
    arch.arch_specific = true;
    s.pop_back();
  }
  if (auto dot = s.find('.'); dot != std::string::npos) s.erase(dot, 1);
  check(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit((unsigned char)c); }),
        "'{}' is not a CUDA architecture (expected sm_90a, sm_121, 12.1, ...)", text);
  arch.capability = std::stoi(s);
  return arch;
}

std::string format_cuda_arch(int capability) {
  return fmt::format("sm_{}", capability);
}

bool cuda_arch_runs_on(const CudaArch& built, int gpu) {
  if (built.capability == gpu) return true;
  if (built.arch_specific) return false;
  return built.capability / 10 == gpu / 10 && built.capability % 10 <= gpu % 10;
}

std::string normalize_arch(std::string_view arch) {
  std::string a = ascii_lower(arch);
  if (a == "aarch64" || a == "arm64" || a == "linux/arm64") return "aarch64";
  if (a == "x86_64" || a == "amd64" || a == "x86-64" || a == "linux/amd64") return "x86_64";
  return "";
}

std::string docker_platform(std::string_view arch) {
  std::string a = normalize_arch(arch);
  if (a == "aarch64") return "linux/arm64";
  if (a == "x86_64") return "linux/amd64";
  return "";
}

}  // namespace moeserve::deploy
