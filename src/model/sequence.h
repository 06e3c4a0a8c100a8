#pragma once
// SequenceRunner: one sequence through a Qwen35Model with caches of its own — prefill, then decode one token
// at a time. For tools (generate, verify) and tests; serving many sequences is the engine's job.

#include <cstdint>
#include <span>
#include <vector>

#include "model/qwen35.h"

namespace moeserve {

class SequenceRunner {
 public:
  // Caches sized for max_tokens positions of one sequence, the KV cache storing kv_dtype.
  SequenceRunner(const Qwen35Model& model, int64_t max_tokens, int page_size = 16,
                 DType kv_dtype = DType::F32);

  // Starts the sequence over with `tokens`; returns the logits of every token (all_logits) or of the last,
  // and with `hidden` every token's final-normed hidden state (SequenceStep::hidden).
  ForwardOutput prefill(std::span<const int32_t> tokens, bool all_logits = false, bool capture_hidden = false,
                        bool hidden = false);
  // Appends one token; returns its logits row.
  std::vector<float> decode(int32_t token);
  // Greedy continuation of `prompt` for max_new tokens (stops early at any of eos_ids).
  std::vector<int32_t> generate_greedy(std::span<const int32_t> prompt, int max_new,
                                       std::span<const int64_t> eos_ids = {},
                                       std::vector<std::vector<float>>* step_logits = nullptr);
  int64_t length() const { return length_; }

 private:
  const Qwen35Model& model_;
  int64_t max_tokens_;
  KvCache kv_;
  StateCache state_;
  std::vector<int32_t> pages_;
  int64_t length_ = 0;
};

// Index of the largest value (the first one on ties, like torch.argmax).
int32_t argmax(std::span<const float> logits);

}  // namespace moeserve
