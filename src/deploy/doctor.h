#pragma once
// `moeserve doctor`: checks a host (and optionally a model directory) for the failures operators hit, each
// with its fix. Facts are gathered under a filesystem root (tests pass a fake one with /proc, /sys and /dev
// files) and judged separately, so every bad case is testable without a GPU.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deploy/build_info.h"

namespace moeserve::deploy {

struct DoctorOptions {
  std::string root = "/";                 // where proc/, sys/, dev/ are read from
  std::string binary = "/proc/self/exe";  // the binary whose architecture must match the CPU
  std::string nvidia_smi = "nvidia-smi";  // command (PATH lookup) or path
  std::string model_dir;                  // optional: checked too
  int port = 30000;                       // 0: skip the port check
  int64_t max_model_len = 0;              // 0: min(32768, max_position_embeddings)
  int max_running_requests = 16;
  double mem_fraction = 0.85;
  int tp = 1;
  std::string kv_cache_dtype = "auto";  // serve's --kv-cache-dtype (auto: bf16 with a GPU, fp32 without)
  std::string cuda_visible_devices = "<unset>";  // the environment's value (tests inject)
};

struct GpuFact {
  std::string name;
  int compute_capability = 0;  // 121 for 12.1; 0 unknown
  double memory_total = -1;    // bytes; -1 when nvidia-smi reports N/A (unified memory)
  double memory_used = -1;
  std::string driver;
};

struct HostFacts {
  BuildInfo build;          // this moeserve's CUDA backend and architectures (tests inject others)
  std::string cpu_arch;     // normalised: x86_64, aarch64, ...
  std::string binary_arch;  // from the binary's ELF header ("" when unreadable)
  std::string binary_path;
  double mem_total = -1, mem_available = -1;  // /proc/meminfo, bytes
  double cgroup_limit = -1;                   // /sys/fs/cgroup/memory.max (cgroup v2), bytes
  double shm_size = -1;                       // /dev/shm, bytes
  std::vector<std::string> nvidia_devices;    // /dev/nvidia0, /dev/nvidiactl, ...
  std::string kernel_driver;                  // /proc/driver/nvidia/version
  bool nvidia_smi_found = false;
  int nvidia_smi_status = 0;
  std::string nvidia_smi_error;
  std::vector<GpuFact> gpus;
  std::vector<int> listening_ports;                               // /proc/net/tcp and tcp6, state LISTEN
  int64_t nofile_soft = -1, nofile_hard = -1, memlock_soft = -1;  // -1 unknown, INT64_MAX unlimited
};

enum class CheckStatus { Ok, Info, Warn, Fail };

struct DoctorCheck {
  std::string name;
  CheckStatus status = CheckStatus::Ok;
  std::string detail;
  std::string fix;  // what to do (empty when ok)
};

HostFacts probe_host(const DoctorOptions& options);
std::vector<DoctorCheck> check_host(const HostFacts& facts, const DoctorOptions& options);
// The model directory: config, shards present and complete, dtypes, context and memory against this host.
std::vector<DoctorCheck> check_model(const std::string& dir, const HostFacts& facts,
                                     const DoctorOptions& options);

std::string format_checks(const std::vector<DoctorCheck>& checks);
nlohmann::json checks_to_json(const std::vector<DoctorCheck>& checks);
const char* status_name(CheckStatus s);

// ELF e_machine of a file as an architecture name (x86_64, aarch64, ...), "" when not an ELF file.
std::string elf_arch(const std::string& path);

}  // namespace moeserve::deploy
