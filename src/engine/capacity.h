#pragma once
// How the cache memory budget is split between GDN state slots and KV pages (engine-internal).

#include <cstdint>

#include "engine/engine.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"

namespace moeserve {

// Sizes the caches for a model whose caches look like kv (num_pages ignored) and state (num_slots ignored).
// State slots come first: max_running_requests live slots (with running_from_memory, as many as the budget
// holds at running_context tokens each, at most that), then the snapshot slots (fewer if the budget is
// short, down to none); the rest of the budget becomes KV pages. Also resolves the scheduler's step budget
// (by where kv.memory says the caches live). Throws moeserve::Error when one
// max_model_len request cannot fit; when max_model_len was left to the model it shrinks to what fits instead.
// available_memory is what "fraction of memory" refers to (MemAvailable on CPU).
EngineCapacity size_caches(const KvCacheSpec& kv, const StateCacheSpec& state, const EngineOptions& options,
                           int64_t model_max_len, int64_t available_memory);

// Bytes of memory the OS reports available (MemAvailable), or 0 when unknown.
int64_t available_memory_bytes();

}  // namespace moeserve
