#pragma once
// ScriptedModel: a test double for the MODEL only (the engine, caches, sampler, text pipeline and HTTP layer
// are the real ones). After the prompt it "generates" a fixed script of token ids, then eos: the logits of
// each position put all the weight on the next script token. That lets tests drive exact text through the
// server — reasoning blocks, tool calls, stop strings — and know the answer.
//
// The script is placed after the last occurrence of `anchor` (a token sequence) in the sequence, so a test
// that does not know the exact prompt ids (a chat template renders them) can still script the reply: the
// anchor is the end of the generation prompt, e.g. "<|im_start|>assistant\n". The tokens are stored in the
// KV pages and read back through the page table at every step, so prefix-cache reuse is exercised for real.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/error.h"
#include "engine/model_runner.h"

namespace moeserve::server {

// Holds the model's forward passes until a test lets them through, so a test can look at a request while it
// is known to be running (no timing involved).
class StepGate {
 public:
  // Lets `steps` more forward passes run.
  void allow(int steps) {
    {
      std::lock_guard lock(mutex_);
      allowed_ += steps;
    }
    cv_.notify_all();
  }
  void open() { allow(1 << 30); }
  // The model's side: waits until a step is allowed, then takes it.
  void pass() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return allowed_ > 0; });
    --allowed_;
    ++passed_;
    cv_.notify_all();
  }
  // Waits until `n` steps have run in all.
  void wait_passed(int n) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return passed_ >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int allowed_ = 0, passed_ = 0;
};

class ScriptedModel : public ModelRunner {
 public:
  ScriptedModel(int64_t vocab, int32_t eos, std::vector<int32_t> anchor, std::vector<int32_t> script)
      : vocab_(vocab), eos_(eos), anchor_(std::move(anchor)), script_(std::move(script)) {}

  int64_t vocab_size() const override { return vocab_; }
  int64_t max_position_embeddings() const override { return 4096; }
  std::vector<int32_t> eos_token_ids() const override { return {eos_}; }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return {1, 1, 2, page_size, num_pages};
  }
  StateCacheSpec state_cache_spec(int num_slots) const override { return {1, 2, 2, 1, 1, 1, num_slots}; }

  // The token the script puts after `prefix` (eos past its end or without the anchor).
  int32_t next_after(std::span<const int32_t> prefix) const {
    if (anchor_.empty() || prefix.size() < anchor_.size()) return eos_;
    for (size_t end = prefix.size(); end >= anchor_.size(); --end) {
      if (std::equal(anchor_.begin(), anchor_.end(), prefix.begin() + (end - anchor_.size()))) {
        size_t k = prefix.size() - end;
        return k < script_.size() ? script_[k] : eos_;
      }
    }
    return eos_;
  }

  // Every forward pass waits for the gate first (none: runs freely).
  void set_gate(std::shared_ptr<StepGate> gate) { gate_ = std::move(gate); }

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache&) override {
    if (gate_) gate_->pass();
    ForwardOutput out;
    const int ps = kv.spec().page_size;
    auto row = [&](std::span<const int32_t> pages, int64_t pos) {
      check(pos / ps < int64_t(pages.size()), "scripted model: position {} beyond the page table", pos);
      return kv.keys(0, pages[size_t(pos / ps)]) + (pos % ps) * 2;
    };
    for (const auto& s : batch) {
      for (size_t i = 0; i < s.tokens.size(); ++i)
        row(s.pages, s.start_pos + int64_t(i))[0] = float(s.tokens[i]);
      int64_t end = s.start_pos + int64_t(s.tokens.size());
      int64_t first = s.all_logits ? s.start_pos + 1 : end;
      std::vector<int32_t> prefix;
      for (int64_t p = 0; p < end; ++p) prefix.push_back(int32_t(row(s.pages, p)[0]));
      for (int64_t len = first; len <= end; ++len) {
        size_t base = out.logits.size();
        // A clear winner (20), a graded runner-up so top_logprobs has something to show (0), the rest far
        // below
        // (-50): at temperature 1, the default, an off-script token is drawn with probability ~e^-20 per
        // token, not the ~vocab * e^-20 = 3e-4 of a flat rest at 0, which made a full run flaky.
        out.logits.resize(base + size_t(vocab_), -50.0f);
        int32_t next = next_after(std::span<const int32_t>(prefix.data(), size_t(len)));
        out.logits[base + size_t(next)] = 20.0f;
        out.logits[base + size_t((next + 1) % vocab_)] = 0.0f;
        ++out.rows;
      }
    }
    return out;
  }

 private:
  int64_t vocab_;
  int32_t eos_;
  std::vector<int32_t> anchor_;
  std::vector<int32_t> script_;
  std::shared_ptr<StepGate> gate_;
};

}  // namespace moeserve::server
