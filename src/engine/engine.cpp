// First landing: the public API only. The scheduler, caches and engine thread follow (issue 4); until then
// create() reports that the engine is not built yet, so callers can compile and link against the API.
#include "engine/engine.h"

#include <fmt/format.h>

#include "common/error.h"
#include "engine/model_runner.h"

namespace moeserve {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    case FinishReason::None: break;
  }
  return "";
}

std::string EngineCapacity::summary() const {
  return fmt::format("KV cache {} pages x {} tokens = {} tokens ({:.1f} MiB); GDN state {} live + {} snapshot slots "
                     "({:.1f} MiB); max_model_len {}",
                     kv_pages, page_size, kv_tokens, kv_bytes / 1048576.0, live_slots, snapshot_slots,
                     state_bytes / 1048576.0, max_model_len);
}

struct Engine::Impl {};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(const ModelWeights&, const EngineOptions&) {
  fail("the engine is not implemented yet (issue 4)");
}
std::unique_ptr<Engine> Engine::create(std::unique_ptr<ModelRunner>, const EngineOptions&) {
  fail("the engine is not implemented yet (issue 4)");
}
void Engine::submit(GenerateRequest) { fail("the engine is not implemented yet (issue 4)"); }
bool Engine::cancel(const std::string&) { return false; }
EngineStats Engine::stats() const { return {}; }
const EngineCapacity& Engine::capacity() const {
  static const EngineCapacity none;
  return none;
}
int64_t Engine::vocab_size() const { return 0; }
const std::vector<int32_t>& Engine::eos_token_ids() const {
  static const std::vector<int32_t> none;
  return none;
}
void Engine::flush_cache() {}
void Engine::shutdown() {}
bool Engine::alive() const { return false; }

}  // namespace moeserve
