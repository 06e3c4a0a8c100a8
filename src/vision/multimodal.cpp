#include "vision/multimodal.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace moeserve {

std::vector<int32_t> expand_image_placeholders(std::span<const int32_t> tokens, int32_t image_token,
                                               std::span<const ImageGrid> grids) {
  std::vector<int32_t> out;
  size_t image = 0;
  for (int32_t t : tokens) {
    if (t != image_token) {
      out.push_back(t);
      continue;
    }
    check(image < grids.size(), "the prompt has more image placeholders than images ({})", grids.size());
    out.insert(out.end(), size_t(grids[image++].tokens()), image_token);
  }
  check(image == grids.size(), "the prompt has {} image placeholders for {} images", image, grids.size());
  return out;
}

MultimodalPrompt MultimodalPrompt::make(std::vector<int32_t> tokens, int32_t image_token,
                                        std::span<const ImageGrid> grids, std::vector<float> features,
                                        int64_t hidden) {
  MultimodalPrompt p;
  p.hidden = hidden;
  const int64_t T = int64_t(tokens.size());
  p.positions.assign(size_t(3 * T), 0);
  int64_t next = 0;  // the running position
  size_t image = 0;
  for (int64_t i = 0; i < T;) {
    if (tokens[size_t(i)] != image_token) {
      for (int axis = 0; axis < 3; ++axis) p.positions[size_t(axis * T + i)] = next;
      ++next, ++i;
      continue;
    }
    int64_t run = 0;
    while (i + run < T && tokens[size_t(i + run)] == image_token) ++run;
    check(image < grids.size(), "the prompt has more images than the {} given", grids.size());
    const ImageGrid& g = grids[image++];
    check(run == g.tokens(), "image {} has {} tokens in the prompt but {} features ({}x{} merged)", image,
          run, g.tokens(), g.rows, g.cols);
    for (int64_t k = 0; k < run; ++k) {
      p.positions[size_t(i + k)] = next;
      p.positions[size_t(T + i + k)] = next + k / g.cols;
      p.positions[size_t(2 * T + i + k)] = next + k % g.cols;
      p.image_rows.push_back(int32_t(i + k));
    }
    next += std::max(g.rows, g.cols);
    i += run;
  }
  check(image == grids.size(), "the prompt has {} images for {} given", image, grids.size());
  check(features.empty() || int64_t(features.size()) == int64_t(p.image_rows.size()) * hidden,
        "{} image feature values for {} image tokens of {}", features.size(), p.image_rows.size(), hidden);
  p.rope_delta = next - T;
  p.tokens = std::move(tokens);
  p.features = std::move(features);
  return p;
}

void PromptChunk::apply(SequenceStep& step) const {
  step.feature_rows = feature_rows;
  step.features = features;
  step.rope_positions = positions;
}

PromptChunk prompt_chunk(const MultimodalPrompt& p, int64_t begin, int64_t end) {
  const int64_t T = int64_t(p.tokens.size()), n = end - begin;
  check(begin >= 0 && begin < end, "prompt chunk [{}, {}) of {} tokens", begin, end, T);
  PromptChunk c;
  auto first = std::lower_bound(p.image_rows.begin(), p.image_rows.end(), int32_t(begin));
  auto last = std::lower_bound(first, p.image_rows.end(), int32_t(end));
  for (auto it = first; it != last; ++it) c.feature_rows.push_back(int32_t(*it - begin));
  const size_t index = size_t(first - p.image_rows.begin());
  check(c.feature_rows.empty() || p.features.size() == p.image_rows.size() * size_t(p.hidden),
        "prompt chunk [{}, {}): the images' features are missing", begin, end);
  if (!c.feature_rows.empty())
    c.features = std::span<const float>(p.features)
                     .subspan(index * size_t(p.hidden), c.feature_rows.size() * size_t(p.hidden));
  c.positions.resize(size_t(3 * n));
  const int64_t in_prompt = std::clamp<int64_t>(T - begin, 0, n);
  for (int axis = 0; axis < 3; ++axis) {
    if (in_prompt > 0)
      std::copy_n(p.positions.begin() + axis * T + begin, in_prompt, c.positions.begin() + axis * n);
    for (int64_t i = in_prompt; i < n; ++i) c.positions[size_t(axis * n + i)] = begin + i + p.rope_delta;
  }
  return c;
}

MultimodalSequence::MultimodalSequence(const Qwen35Model& model, int64_t max_tokens, int page_size)
    : model_(model),
      kv_(model.kv_cache_spec(page_size, (max_tokens + page_size - 1) / page_size)),
      state_(model.state_cache_spec(1)),
      pages_(static_cast<size_t>(kv_.spec().num_pages)) {
  std::iota(pages_.begin(), pages_.end(), 0);
}

std::vector<float> MultimodalSequence::prefill(const MultimodalPrompt& prompt, int64_t chunk, bool all_logits,
                                               std::vector<float>* embeddings) {
  const int64_t T = int64_t(prompt.tokens.size());
  check(T > 0 && chunk > 0, "an empty prompt or chunk");
  check(T <= int64_t(pages_.size()) * kv_.spec().page_size, "the prompt does not fit this sequence's cache");
  check(!embeddings || chunk >= T, "embeddings are captured from a single-chunk prefill");
  std::vector<float> logits;
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t end = std::min(T, begin + chunk);
    PromptChunk c = prompt_chunk(prompt, begin, end);
    SequenceStep step{std::span<const int32_t>(prompt.tokens).subspan(size_t(begin), size_t(end - begin)),
                      begin, pages_, 0, all_logits};
    c.apply(step);
    auto out = model_.forward({&step, 1}, kv_, state_, embeddings != nullptr);
    if (embeddings)
      embeddings->assign(out.hidden_states.begin(),
                         out.hidden_states.begin() + T * model_.config().hidden_size);
    if (all_logits || end == T) logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  length_ = T;
  rope_delta_ = prompt.rope_delta;
  return logits;
}

std::vector<float> MultimodalSequence::decode(int32_t token) {
  check(length_ > 0, "decode before prefill");
  check(length_ < int64_t(pages_.size()) * kv_.spec().page_size, "the sequence is full");
  SequenceStep step{{&token, 1}, length_, pages_, 0, false};
  step.rope_delta = rope_delta_;
  auto out = model_.forward({&step, 1}, kv_, state_);
  ++length_;
  return std::move(out.logits);
}

}  // namespace moeserve
