#include "engine/request.h"

namespace moeserve {

void mtp_image_rows(const Request& r, int64_t start, int64_t rows, MtpImageRows& keep, SequenceStep& s) {
  const MultimodalPrompt& mm = *r.mm;
  keep.tokens.clear();
  for (int64_t p = start; p < start + rows; ++p) keep.tokens.push_back(r.model_token(p + 1));
  s.tokens = keep.tokens;
  keep.next = prompt_chunk(mm, start + 1, start + rows + 1);
  s.feature_rows = keep.next.feature_rows;
  s.features = keep.next.features;
  if (start >= r.prompt_len) {
    // Text after the prompt: every axis at cache index + rope_delta, as the model's decode steps (and the
    // same fused attention path).
    s.rope_delta = mm.rope_delta;
  } else {
    keep.position = prompt_chunk(mm, start, start + rows);
    s.rope_positions = keep.position.positions;
  }
}

}  // namespace moeserve
