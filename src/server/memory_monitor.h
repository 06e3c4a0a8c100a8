#pragma once
// Memory-pressure sensing for unified-memory nodes (DGX Spark: CPU and GPU share 128 GB). The host figure is
// the tightest of the cgroup limit (v2 memory.max or v1 memory.limit_in_bytes, working set = usage minus
// inactive file pages, as the kubelet counts it) and the machine (MemTotal - MemAvailable). Extra sources,
// such as the GPU's device memory, can be added; the most pressured source wins.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace moeserve::server {

struct MemoryReading {
  uint64_t used_bytes = 0;
  uint64_t limit_bytes = 0;  // 0: unknown
  std::string source;        // "cgroup-v2", "cgroup-v1", "meminfo", or an added source's name
  double fraction() const { return limit_bytes ? double(used_bytes) / double(limit_bytes) : 0.0; }
};

class MemoryMonitor {
 public:
  // root: the file-system root to read /proc and /sys/fs/cgroup under ("/" normally; a folder in tests).
  explicit MemoryMonitor(std::string root = "/", std::chrono::milliseconds max_age = std::chrono::milliseconds(200));

  // A source returns nullopt when it has no figure (e.g. no GPU).
  void add_source(std::string name, std::function<std::optional<MemoryReading>()> read);

  // The most pressured source, sampled at most once per max_age.
  MemoryReading reading();

  // Host memory only, read now (no caching).
  std::optional<MemoryReading> read_host() const;

 private:
  std::optional<MemoryReading> read_cgroup_v2() const;
  std::optional<MemoryReading> read_cgroup_v1() const;
  std::optional<MemoryReading> read_meminfo() const;

  std::string root_;
  std::chrono::milliseconds max_age_;
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::function<std::optional<MemoryReading>()>>> sources_;
  std::optional<std::chrono::steady_clock::time_point> sampled_at_;
  MemoryReading last_;
};

}  // namespace moeserve::server
