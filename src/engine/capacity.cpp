#include "engine/capacity.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "common/error.h"
#include "engine/model_runner.h"

namespace moeserve {

namespace {

// The KV tokens a running request is planned for when its count comes from the budget: the 8K-token prompts
// of the throughput loads (docs/engine.md, "Memory budget"), or max_model_len when that is shorter.
constexpr int64_t kRunningContext = 8192;
// Without a budget, one sized for this many full-length requests (the running count serve fixed before it
// was sized from the budget), which then holds at least as many of running_context tokens.
constexpr int kDefaultBudgetRequests = 16;

// Default step budgets (docs/engine.md, "Scheduler"): a GPU's, past the knee where a step's weight reads
// stop dominating, and the host's, where step time grows with every token and only latency is at stake.
constexpr int kDeviceStepTokens = 8192;
constexpr int kHostStepTokens = 2048;

}  // namespace

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
  check(options.max_num_batched_tokens >= 0, "max batched tokens must not be negative, got {}",
        options.max_num_batched_tokens);
  check(options.chunked_prefill_size >= 0, "chunked prefill size must not be negative, got {}",
        options.chunked_prefill_size);
  check(options.running_context >= 0, "running context must not be negative, got {}",
        options.running_context);
}

EngineCapacity size_caches(const KvCacheSpec& kv, const StateCacheSpec& state, const EngineOptions& options,
                           int64_t model_max_len, int64_t available_memory) {
  check_engine_options(options);

  EngineCapacity cap;
  cap.page_size = options.page_size;
  cap.live_slots = options.max_running_requests;  // an upper bound when running_from_memory
  cap.state_dtype = options.state_dtype;
  cap.kv_dtype = kv.dtype;
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
    // Enough for every running request at full length (when the budget is to size their count: for
    // kDefaultBudgetRequests of them), but never more than a quarter of what is available.
    const int64_t n =
        options.running_from_memory ? std::min(cap.live_slots, kDefaultBudgetRequests) : cap.live_slots;
    const int64_t snapshots = options.snapshot_slots < 0 ? 2 * n : options.snapshot_slots;
    budget = n * live_slot_bytes + snapshots * slot_bytes + (n * pages_for(max_len) + 1) * page_bytes;
    if (available_memory > 0) budget = std::min(budget, available_memory / 4);
    source = "default budget";
  }

  // The state slots of `live` running requests (live, then snapshots: at most half of what the live slots
  // leave, so the KV cache keeps room) and the KV pages the rest buys; -1 pages when the live slots alone do
  // not fit.
  struct Layout {
    int snapshots = 0;
    int64_t kv_pages = -1;
  };
  auto layout = [&](int live) {
    Layout l;
    const int64_t live_bytes = int64_t(live) * live_slot_bytes;
    if (live_bytes >= budget) return l;
    int64_t snaps = options.snapshot_slots < 0 ? 2 * int64_t(live) : options.snapshot_slots;
    if (slot_bytes > 0) snaps = std::min<int64_t>(snaps, (budget - live_bytes) / 2 / slot_bytes);
    l.snapshots = int(snaps);
    l.kv_pages = (budget - live_bytes - snaps * slot_bytes) / page_bytes;
    return l;
  };

  if (options.running_from_memory) {
    // The most running requests (binary search: the pages left shrink as requests grow) whose state slots
    // leave pages for running_context tokens each, plus the rest of one max_len request (which must fit
    // anyway); at least one.
    cap.running_context =
        std::min(options.running_context > 0 ? options.running_context : kRunningContext, max_len);
    const int64_t extra = std::max<int64_t>(pages_for(max_len) + 1 - pages_for(cap.running_context), 0);
    auto holds = [&](int live) {
      return layout(live).kv_pages >= live * pages_for(cap.running_context) + extra;
    };
    int lo = 1, hi = options.max_running_requests;
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (holds(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    cap.live_slots = lo;
  }

  const Layout l = layout(cap.live_slots);
  check(l.kv_pages >= 0,
        "the {} ({:.1f} MiB) cannot even hold the GDN state of {} running requests ({:.1f} MiB "
        "each); lower max running requests or raise the budget",
        source, budget / 1048576.0, cap.live_slots, slot_bytes / 1048576.0);
  cap.snapshot_slots = l.snapshots;
  cap.state_bytes = int64_t(cap.live_slots) * live_slot_bytes + int64_t(l.snapshots) * slot_bytes;
  cap.kv_pages = l.kv_pages;

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
  cap.max_num_batched_tokens = options.max_num_batched_tokens > 0 ? options.max_num_batched_tokens
                               : kv.memory != nullptr             ? kDeviceStepTokens
                                                                  : kHostStepTokens;
  cap.chunked_prefill_size =
      options.chunked_prefill_size > 0 ? options.chunked_prefill_size : cap.max_num_batched_tokens;
  cap.max_num_batched_tokens = std::max(cap.max_num_batched_tokens, cap.chunked_prefill_size);
  cap.kv_tokens = cap.kv_pages * options.page_size;
  cap.kv_bytes = cap.kv_pages * page_bytes;
  return cap;
}

}  // namespace moeserve
