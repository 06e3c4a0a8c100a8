#include "model/sequence.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace moeserve {

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

SequenceRunner::SequenceRunner(const Qwen35Model& model, int64_t max_tokens, int page_size, DType kv_dtype)
    : model_(model),
      max_tokens_(max_tokens),
      kv_(model.kv_cache_spec(page_size, (max_tokens + page_size - 1) / page_size, kv_dtype)),
      state_(model.state_cache_spec(1)),
      pages_(size_t(kv_.spec().num_pages)) {
  std::iota(pages_.begin(), pages_.end(), 0);
}

ForwardOutput SequenceRunner::prefill(std::span<const int32_t> tokens, bool all_logits, bool capture_hidden,
                                      bool hidden) {
  check(!tokens.empty(), "the prompt is empty");
  check(int64_t(tokens.size()) <= max_tokens_, "the prompt has {} tokens; this runner holds {}",
        tokens.size(), max_tokens_);
  SequenceStep step{tokens, 0, pages_, 0, all_logits};
  step.hidden = hidden;
  auto out = model_.forward({&step, 1}, kv_, state_, capture_hidden);
  if (hidden) model_.download_hidden(out.hidden);
  length_ = int64_t(tokens.size());
  return out;
}

std::vector<float> SequenceRunner::decode(int32_t token) {
  check(length_ > 0, "decode before prefill");
  check(length_ < max_tokens_, "the sequence is full ({} tokens)", max_tokens_);
  SequenceStep step{{&token, 1}, length_, pages_, 0, false};
  auto out = model_.forward({&step, 1}, kv_, state_);
  ++length_;
  return std::move(out.logits);
}

std::vector<int32_t> SequenceRunner::generate_greedy(std::span<const int32_t> prompt, int max_new,
                                                     std::span<const int64_t> eos_ids,
                                                     std::vector<std::vector<float>>* step_logits) {
  std::vector<int32_t> generated;
  if (max_new <= 0) return generated;
  std::vector<float> logits = prefill(prompt).logits;
  while (true) {
    if (step_logits) step_logits->push_back(logits);
    int32_t next = argmax(logits);
    generated.push_back(next);
    bool eos = std::find(eos_ids.begin(), eos_ids.end(), int64_t(next)) != eos_ids.end();
    if (eos || int(generated.size()) == max_new) break;
    logits = decode(next);
  }
  return generated;
}

}  // namespace moeserve
