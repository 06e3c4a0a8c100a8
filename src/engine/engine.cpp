// Engine: the thread around EngineCore, its inbox (submit, cancel, flush) and the published stats.
#include "engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "engine/engine_core.h"

namespace moeserve {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
    case FinishReason::None:
      break;
  }
  return "";
}

int step_batch_bucket(size_t sequences) {
  // Bucket i holds (2^(i-1), 2^i]: the bit width of sequences - 1.
  const int i = sequences <= 1 ? 0 : std::bit_width(sequences - 1);
  return std::min(i, kStepBatchBuckets - 1);
}

std::string EngineCapacity::summary() const {
  return fmt::format(
      "KV cache {} pages x {} tokens = {} tokens ({:.1f} MiB, {}); GDN state {} live + {} snapshot slots "
      "({:.1f} MiB{}); max model length {}; max running requests {}{}; {} tokens per step",
      kv_pages, page_size, kv_tokens, kv_bytes / 1048576.0, kv_cache_dtype_name(kv_dtype), live_slots,
      snapshot_slots, state_bytes / 1048576.0, state_dtype == StateDtype::BF16 ? ", bf16" : "", max_model_len,
      live_slots,
      running_context > 0 ? fmt::format(" (sized from the budget at {} tokens each)", running_context) : "",
      max_num_batched_tokens);
}

struct Engine::Impl {
  Impl(std::unique_ptr<ModelRunner> runner, const EngineOptions& options);
  ~Impl() { shutdown(); }

  void submit(GenerateRequest request);
  bool cancel(const std::string& id);
  void shutdown();
  void run();  // the engine thread

  EngineCore core;  // touched only by the engine thread once it runs
  EngineOptions options;

  // The inbox, shared with every caller thread.
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<GenerateRequest> incoming;
  std::vector<std::string> cancels;
  std::unordered_set<std::string> live_ids;
  bool flush_requested = false;
  bool stopping = false;

  mutable std::mutex stats_mutex;
  EngineStats stats;
  std::atomic<bool> alive{false};
  std::thread thread;
};

Engine::Impl::Impl(std::unique_ptr<ModelRunner> runner, const EngineOptions& opts)
    : core(std::move(runner), opts), options(opts) {
  core.set_on_retired([this](const std::string& id) {
    std::lock_guard lock(mutex);
    live_ids.erase(id);
  });
  stats = core.stats();
  spdlog::info("engine: {}", core.capacity().summary());
  alive = true;
  thread = std::thread([this] { run(); });
}

void Engine::Impl::submit(GenerateRequest request) {
  core.validate(request);  // reads only what create() fixed
  {
    std::lock_guard lock(mutex);
    check(!stopping && alive, "the engine is shut down");
    check(!live_ids.count(request.id), "a request with id {} is already running", request.id);
    if (options.max_queued_requests > 0) {
      int queued;
      {
        std::lock_guard s(stats_mutex);
        queued = stats.queued;
      }
      check(queued + int(incoming.size()) < options.max_queued_requests,
            "the queue is full ({} requests waiting); retry later", options.max_queued_requests);
    }
    live_ids.insert(request.id);
    incoming.push_back(std::move(request));
  }
  wake.notify_one();
}

bool Engine::Impl::cancel(const std::string& id) {
  {
    std::lock_guard lock(mutex);
    if (!live_ids.count(id)) return false;
    cancels.push_back(id);
  }
  wake.notify_one();
  return true;
}

void Engine::Impl::shutdown() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_one();
  if (thread.joinable()) thread.join();
}

void Engine::Impl::run() {
  for (;;) {
    std::vector<GenerateRequest> arrived;
    std::vector<std::string> cancelled;
    bool flush = false, stop = false;
    {
      std::unique_lock lock(mutex);
      if (core.idle())
        wake.wait(lock, [&] { return stopping || !incoming.empty() || !cancels.empty() || flush_requested; });
      arrived.swap(incoming);
      cancelled.swap(cancels);
      flush = std::exchange(flush_requested, false);
      stop = stopping;
    }
    try {
      for (auto& r : arrived) core.add(std::move(r));
      for (const auto& id : cancelled) core.cancel(id);
      if (stop) {
        core.abort_all();
      } else {
        if (flush) core.flush_cache();
        core.step();
      }
    } catch (const std::exception& e) {
      // A bug, not a request's fault: fail what is in flight rather than take the process down.
      spdlog::error("engine: {}", e.what());
      core.abort_all();
    }
    {
      std::lock_guard lock(stats_mutex);
      stats = core.stats();
    }
    core.deliver();
    if (stop) break;
  }
  std::lock_guard lock(mutex);
  alive = false;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(std::unique_ptr<ModelRunner> model, const EngineOptions& options) {
  return std::unique_ptr<Engine>(new Engine(std::make_unique<Impl>(std::move(model), options)));
}

void Engine::submit(GenerateRequest request) {
  impl_->submit(std::move(request));
}
bool Engine::cancel(const std::string& id) {
  return impl_->cancel(id);
}
EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->stats_mutex);
  return impl_->stats;
}
const EngineCapacity& Engine::capacity() const {
  return impl_->core.capacity();
}
int64_t Engine::vocab_size() const {
  return impl_->core.vocab_size();
}
const std::vector<int32_t>& Engine::eos_token_ids() const {
  return impl_->core.eos_token_ids();
}
void Engine::flush_cache() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->flush_requested = true;
  }
  impl_->wake.notify_one();
}
void Engine::shutdown() {
  impl_->shutdown();
}
bool Engine::alive() const {
  return impl_->alive;
}

}  // namespace moeserve
