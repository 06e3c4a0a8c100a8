#include "server/memory_monitor.h"

#include <fstream>
#include <sstream>

namespace moeserve::server {

namespace {

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> read_number(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  try {
    size_t used = 0;
    uint64_t v = std::stoull(*text, &used);
    return v;
  } catch (const std::exception&) {
    return std::nullopt;  // "max" or garbage: no limit
  }
}

// The value of "key value" (memory.stat) or "Key: value kB" (meminfo) lines, times `unit`.
std::optional<uint64_t> read_key(const std::string& text, const std::string& key, uint64_t unit) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size()) continue;
    char next = line[key.size()];
    if (next != ' ' && next != ':' && next != '\t') continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t v = 0;
    if (fields >> v) return v * unit;
  }
  return std::nullopt;
}

// Limits this large mean "unlimited" (cgroup v1 reports PAGE_COUNTER_MAX rounded to pages).
constexpr uint64_t kUnlimited = uint64_t(1) << 60;

}  // namespace

MemoryMonitor::MemoryMonitor(std::string root, std::chrono::milliseconds max_age)
    : root_(std::move(root)), max_age_(max_age) {
  if (root_.empty() || root_.back() != '/') root_ += '/';
}

void MemoryMonitor::add_source(std::string name, std::function<std::optional<MemoryReading>()> read) {
  std::lock_guard lock(mutex_);
  sources_.emplace_back(std::move(name), std::move(read));
  sampled_at_.reset();
}

std::optional<MemoryReading> MemoryMonitor::read_cgroup_v2() const {
  auto limit = read_number(root_ + "sys/fs/cgroup/memory.max");
  auto current = read_number(root_ + "sys/fs/cgroup/memory.current");
  if (!limit || !current || *limit >= kUnlimited) return std::nullopt;
  uint64_t inactive = 0;
  if (auto stat = read_file(root_ + "sys/fs/cgroup/memory.stat")) {
    inactive = read_key(*stat, "inactive_file", 1).value_or(0);
  }
  return MemoryReading{*current > inactive ? *current - inactive : 0, *limit, "cgroup-v2"};
}

std::optional<MemoryReading> MemoryMonitor::read_cgroup_v1() const {
  auto limit = read_number(root_ + "sys/fs/cgroup/memory/memory.limit_in_bytes");
  auto usage = read_number(root_ + "sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (!limit || !usage || *limit >= kUnlimited) return std::nullopt;
  uint64_t inactive = 0;
  if (auto stat = read_file(root_ + "sys/fs/cgroup/memory/memory.stat")) {
    inactive = read_key(*stat, "total_inactive_file", 1).value_or(0);
  }
  return MemoryReading{*usage > inactive ? *usage - inactive : 0, *limit, "cgroup-v1"};
}

std::optional<MemoryReading> MemoryMonitor::read_meminfo() const {
  auto text = read_file(root_ + "proc/meminfo");
  if (!text) return std::nullopt;
  auto total = read_key(*text, "MemTotal", 1024);
  auto available = read_key(*text, "MemAvailable", 1024);
  if (!total || !available || *total == 0) return std::nullopt;
  return MemoryReading{*total > *available ? *total - *available : 0, *total, "meminfo"};
}

std::optional<MemoryReading> MemoryMonitor::read_host() const {
  std::optional<MemoryReading> best;
  for (auto r : {read_cgroup_v2(), read_cgroup_v1(), read_meminfo()}) {
    if (r && (!best || r->fraction() > best->fraction())) best = r;
  }
  return best;
}

MemoryReading MemoryMonitor::reading() {
  std::lock_guard lock(mutex_);
  auto now = std::chrono::steady_clock::now();
  if (sampled_at_ && now - *sampled_at_ < max_age_) return last_;
  std::optional<MemoryReading> best = read_host();
  for (auto& [name, read] : sources_) {
    auto r = read();
    if (r && (!best || r->fraction() > best->fraction())) {
      best = r;
      if (best->source.empty()) best->source = name;
    }
  }
  last_ = best.value_or(MemoryReading{});
  sampled_at_ = now;
  return last_;
}

}  // namespace moeserve::server
