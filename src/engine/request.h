#pragma once
// Request: the engine thread's record of one generation request (internal to the engine).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache_manager.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "vision/multimodal.h"

namespace moeserve {

struct Request {
  std::string id;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int64_t prompt_len = 0;
  SamplingParams params;
  int64_t max_tokens = 0;  // resolved against max_model_len
  int priority = 0;
  uint64_t arrival = 0;  // order of submission
  std::function<void(const GenerateOutput&)> on_output;
  std::optional<Sampler> sampler;

  // Progress through the caches.
  CacheSeq cache;
  int64_t computed = 0;        // tokens[0, computed) are in the KV pages and the live state
  int64_t checkpoint_at = 0;   // a prefill chunk must end here (a branch point worth a snapshot); 0 = none
  int64_t snapshot_hint = 0;   // the caller's turn boundary (GenerateRequest::snapshot_hint); 0 = none
  int64_t cached_tokens = -1;  // prompt tokens the first admission found cached (usage), -1 before it
  bool running = false;

  // Prompt logprobs, collected chunk by chunk (they need every prompt row's logits, hence no cache hit).
  bool prompt_logprobs_pending = false;
  std::vector<LogprobEntry> prompt_logprobs;

  DraftState spec;  // speculative decoding (engine/speculative.h)

  // Images (docs/vision.md). At the image rows, `tokens` holds the prefix cache's keys (negative, derived
  // from each image's hash) and the model sees images->image_token; mm lays the prompt out (M-RoPE positions,
  // image rows) and gathers the features as the engine encodes the images, images_encoded of them so far.
  std::shared_ptr<const PromptImages> images;
  std::optional<MultimodalPrompt> mm;
  size_t images_encoded = 0;
  bool encoded() const { return !images || images_encoded == images->images.size(); }
  int32_t model_token(int64_t i) const {
    const int32_t t = tokens[size_t(i)];
    return t < 0 ? images->image_token : t;
  }

  int64_t generated() const { return int64_t(tokens.size()) - prompt_len; }
  int64_t uncomputed() const { return int64_t(tokens.size()) - computed; }
};

// The MTP layer's rows [start, start + rows) of a request with images, r.mm (engine/speculative.h: row p is
// token t_{p+1} at position p). They take what the model took: the image token, not the prefix cache's key,
// and the image's feature where t_{p+1} is an image row; the model's M-RoPE positions of rows p in the
// prompt, rope_delta after it.
MtpImageRows mtp_image_rows(const Request& r, int64_t start, int64_t rows);
// Points s (tokens, features, positions) at rows, which must outlive the step.
void point_at(const MtpImageRows& rows, SequenceStep& s);

}  // namespace moeserve
