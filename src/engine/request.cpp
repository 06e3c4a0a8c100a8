#include "engine/request.h"

namespace moeserve {

MtpImageRows mtp_image_rows(const Request& r, int64_t start, int64_t rows) {
  const MultimodalPrompt& mm = *r.mm;
  MtpImageRows keep;
  for (int64_t p = start; p < start + rows; ++p) keep.tokens.push_back(r.model_token(p + 1));
  keep.next = prompt_chunk(mm, start + 1, start + rows + 1);
  keep.in_prompt = start < r.prompt_len;
  if (keep.in_prompt)
    keep.position = prompt_chunk(mm, start, start + rows);
  else
    keep.rope_delta = mm.rope_delta;
  return keep;
}

void point_at(const MtpImageRows& rows, SequenceStep& s) {
  s.tokens = rows.tokens;
  s.feature_rows = rows.next.feature_rows;
  s.features = rows.next.features;
  if (rows.in_prompt)
    s.rope_positions = rows.position.positions;
  else
    s.rope_delta = rows.rope_delta;  // the model's decode steps (and the same fused attention path)
}

}  // namespace moeserve
