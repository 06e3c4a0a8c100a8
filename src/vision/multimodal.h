#pragma once
// Images into the language model: the placeholder expanded to an image's tokens, the merged features
// placed at them, and the 3D M-RoPE positions (HF get_rope_index): text at running position p gets (p, p, p);
// an image starting at p gets (p, p + row, p + col) over its merged grid in raster order, and the text after
// it continues at p + max(merged rows, merged cols). Decoding continues at cache index + rope_delta.

#include <cstdint>
#include <span>
#include <vector>

#include "model/qwen35.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"

namespace moeserve {

// An image as the language model sees it: its merged grid (patches / merge size per side).
struct ImageGrid {
  int rows = 0;
  int cols = 0;
  int64_t tokens() const { return int64_t(rows) * cols; }
};

// Each image_token in `tokens` becomes grids[k].tokens() copies for the k-th occurrence (the processor's
// replace_image_token). Throws Error when the counts of placeholders and images differ.
std::vector<int32_t> expand_image_placeholders(std::span<const int32_t> tokens, int32_t image_token,
                                               std::span<const ImageGrid> grids);

struct MultimodalPrompt {
  std::vector<int32_t> tokens;      // placeholders expanded
  std::vector<int32_t> image_rows;  // the prompt index of every image token, ascending
  // [image_rows.size()][hidden]: the images' merged features in order; empty until the tower ran (serving
  // lays the prompt out when a request arrives and encodes its images later).
  std::vector<float> features;
  std::vector<int64_t> positions;  // [3][tokens]
  int64_t rope_delta = 0;          // decode positions: cache index + rope_delta on every axis
  int64_t hidden = 0;

  // Builds positions and rows; every maximal run of image_token is one image, matched in order to grids.
  // Throws Error when runs and grids disagree, or when features are given and are not one row per image
  // token.
  static MultimodalPrompt make(std::vector<int32_t> tokens, int32_t image_token,
                               std::span<const ImageGrid> grids, std::vector<float> features, int64_t hidden);
};

// The SequenceStep fields of the chunk [begin, end); the step's spans point into this. The chunk may run past
// the prompt (a preempted request recomputing its generated tokens): those rows are text at index +
// rope_delta. The prompt's features must be present when the chunk holds image rows.
struct PromptChunk {
  std::vector<int32_t> feature_rows;
  std::span<const float> features;
  std::vector<int64_t> positions;  // [3][end - begin]
  void apply(SequenceStep& step) const;
};
PromptChunk prompt_chunk(const MultimodalPrompt& prompt, int64_t begin, int64_t end);

// One multimodal sequence through a Qwen35Model with caches of its own, for `verify` and tests (serving
// goes through the engine): prefill in chunks of at most `chunk` tokens, then decode.
class MultimodalSequence {
 public:
  MultimodalSequence(const Qwen35Model& model, int64_t max_tokens, int page_size = 16);
  // Logits of every prompt token [T][vocab] when all_logits, else of the last; embeddings after placement
  // (HF's inputs_embeds) into *embeddings when asked (needs the whole prompt as one chunk).
  std::vector<float> prefill(const MultimodalPrompt& prompt, int64_t chunk, bool all_logits,
                             std::vector<float>* embeddings = nullptr);
  std::vector<float> decode(int32_t token);

 private:
  const Qwen35Model& model_;
  KvCache kv_;
  StateCache state_;
  std::vector<int32_t> pages_;
  int64_t length_ = 0;
  int64_t rope_delta_ = 0;
};

}  // namespace moeserve
