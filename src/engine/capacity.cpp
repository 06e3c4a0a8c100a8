#include "engine/capacity.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "common/error.h"
#include "engine/model_runner.h"

namespace moeserve {

int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

int64_t ModelRunner::cache_memory_available() const {
  return available_memory_bytes();
}

void check_engine_options(const EngineOptions& options) {
  check(options.page_size > 0, "page size must be positive, got {}", options.page_size);
  check(options.max_running_requests > 0, "max running requests must be positive, got {}",
        options.max_running_requests);
  check(options.mem_fraction >= 0 && options.mem_fraction <= 1, "mem fraction must be in [0, 1], got {}",
        options.mem_fraction);
  check(options.max_model_len >= 0, "max model length must not be negative, got {}", options.max_model_len);
}

EngineCapacity size_caches(const KvCacheSpec& kv, const StateCacheSpec& state, const EngineOptions& options,
                           int64_t model_max_len, int64_t available_memory) {
  check_engine_options(options);

  EngineCapacity cap;
  cap.page_size = options.page_size;
  cap.live_slots = options.max_running_requests;
  cap.state_dtype = options.state_dtype;
  cap.kv_dtype = kv.dtype;
  int snapshots = options.snapshot_slots < 0 ? 2 * cap.live_slots : options.snapshot_slots;
  int64_t max_len = options.max_model_len > 0 ? options.max_model_len : model_max_len;
  check(max_len > 1, "max model length must be at least 2 tokens, got {}", max_len);

  const int64_t slot_bytes = state.bytes_per_slot();
  // A speculating live slot brings its trail slots (engine/speculative.h).
  const int64_t live_slot_bytes = slot_bytes * (1 + std::max(options.speculative_num_steps, 0));
  KvCacheSpec paged = kv;
  paged.page_size = options.page_size;
  const int64_t page_bytes = std::max<int64_t>(paged.bytes_per_page(), 1);
  auto pages_for = [&](int64_t tokens) { return (tokens + options.page_size - 1) / options.page_size; };

  int64_t budget;
  const char* source;
  if (options.cache_memory_bytes > 0) {
    budget = options.cache_memory_bytes;
    source = "cache memory budget";
  } else if (options.mem_fraction > 0) {
    check(available_memory > 0,
          "mem fraction given, but the available memory is unknown; give a byte budget");
    budget = int64_t(double(available_memory) * options.mem_fraction);
    source = "memory fraction";
  } else {
    // Enough for every running request at full length, but never more than a quarter of what is available.
    budget = int64_t(cap.live_slots) * live_slot_bytes + int64_t(snapshots) * slot_bytes +
             (int64_t(cap.live_slots) * pages_for(max_len) + 1) * page_bytes;
    if (available_memory > 0) budget = std::min(budget, available_memory / 4);
    source = "default budget";
  }

  const int64_t live_bytes = int64_t(cap.live_slots) * live_slot_bytes;
  check(live_bytes < budget,
        "the {} ({:.1f} MiB) cannot even hold the GDN state of {} running requests ({:.1f} MiB "
        "each); lower max running requests or raise the budget",
        source, budget / 1048576.0, cap.live_slots, slot_bytes / 1048576.0);
  // Snapshots may take at most half of what the live slots leave, so the KV cache keeps room.
  if (slot_bytes > 0) snapshots = int(std::min<int64_t>(snapshots, (budget - live_bytes) / 2 / slot_bytes));
  cap.snapshot_slots = snapshots;
  cap.state_bytes = live_bytes + int64_t(snapshots) * slot_bytes;
  cap.kv_pages = (budget - cap.state_bytes) / page_bytes;

  // One request of max_len tokens must fit, plus one page for copy-on-write of a shared partial page.
  if (cap.kv_pages < pages_for(max_len) + 1) {
    check(
        options.max_model_len == 0,
        "max model length {} needs {} KV pages, but the {} leaves room for {} ({} tokens); lower it or raise "
        "the budget",
        max_len, pages_for(max_len) + 1, source, cap.kv_pages, cap.kv_pages * options.page_size);
    max_len = (cap.kv_pages - 1) * options.page_size;
    check(max_len >= 16, "the {} leaves room for only {} KV pages of {} tokens; raise it", source,
          cap.kv_pages, options.page_size);
  }
  cap.max_model_len = max_len;
  cap.kv_tokens = cap.kv_pages * options.page_size;
  cap.kv_bytes = cap.kv_pages * page_bytes;
  return cap;
}

}  // namespace moeserve
