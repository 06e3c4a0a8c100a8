#include <condition_variable>
#include <deque>
#include <mutex>

#include "engine/engine.h"

namespace moeserve {

struct OutputStream::State {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<GenerateOutput> events;
  bool final_taken = false;
};

OutputStream::OutputStream() : state_(std::make_shared<State>()) {}
OutputStream::~OutputStream() = default;

std::function<void(const GenerateOutput&)> OutputStream::sink() {
  return [state = state_](const GenerateOutput& out) {
    {
      std::lock_guard lock(state->mutex);
      state->events.push_back(out);
    }
    state->ready.notify_all();
  };
}

std::optional<GenerateOutput> OutputStream::next() {
  std::unique_lock lock(state_->mutex);
  if (state_->final_taken) return std::nullopt;
  state_->ready.wait(lock, [&] { return !state_->events.empty(); });
  GenerateOutput out = std::move(state_->events.front());
  state_->events.pop_front();
  if (out.finished) state_->final_taken = true;
  return out;
}

std::optional<GenerateOutput> OutputStream::try_next() {
  std::lock_guard lock(state_->mutex);
  if (state_->final_taken || state_->events.empty()) return std::nullopt;
  GenerateOutput out = std::move(state_->events.front());
  state_->events.pop_front();
  if (out.finished) state_->final_taken = true;
  return out;
}

GenerateOutput OutputStream::collect() {
  GenerateOutput all;
  while (auto out = next()) {
    all.request_id = out->request_id;
    all.tokens.insert(all.tokens.end(), out->tokens.begin(), out->tokens.end());
    all.logprobs.insert(all.logprobs.end(), out->logprobs.begin(), out->logprobs.end());
    if (!out->prompt_logprobs.empty()) all.prompt_logprobs = std::move(out->prompt_logprobs);
    all.finished = out->finished;
    all.finish_reason = out->finish_reason;
    all.stop_token = out->stop_token;
    all.error = out->error;
    all.usage = out->usage;
  }
  return all;
}

}  // namespace moeserve
