#pragma once
// What one forward step takes and gives: SequenceStep (one sequence's share of a batch) and ForwardOutput
// (logits, candidates, hidden rows). Their own header so that the engine's ModelRunner, which speaks in them,
// needs neither Qwen35Model nor the backend interface.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/logit_candidates.h"

namespace moeserve {

// One sequence's share of a forward step.
struct SequenceStep {
  std::span<const int32_t> tokens;  // the new tokens this step (prompt chunk, or one token when decoding)
  int64_t start_pos = 0;            // tokens of this sequence already in the caches
  std::span<const int32_t> pages;   // page table covering positions [0, start_pos + tokens.size())
  int32_t state_slot = 0;           // GDN state slot; start_pos == 0 starts from a zero state
  bool all_logits = false;          // logits of every new token (verify, prompt logprobs) or only the last
  // > 0: instead of the logits rows (the last, or every row with all_logits), each row reduced where the
  // backend runs to its `candidates` most likely tokens and its normalisers (LogitCandidates), so a GPU sends
  // a few KB instead of the whole vocabulary. Every step of a batch asks for the same count or 0.
  int candidates = 0;
  float temperature = 1.0f;  // for LogitCandidates::sum_exp_t (> 0)
  // Images (docs/vision.md): the rows of this step listed in feature_rows (step-relative, ascending) take
  // their embeddings from features ([feature_rows.size()][hidden], host memory) instead of the token table.
  std::span<const int32_t> feature_rows{};
  std::span<const float> features{};
  // M-RoPE positions of the new tokens as [3][tokens] (temporal, height, width; host memory). Empty: every
  // axis is start_pos + i + rope_delta (text after an image runs rope_delta behind its cache index).
  std::span<const int64_t> rope_positions{};
  int64_t rope_delta = 0;
  // Speculative decoding (engine/speculative.h). hidden: also keep the final-normed hidden state of every
  // new token where the model runs (Qwen35Model::mtp_draft, download_hidden), what the MTP layer drafts from.
  // trail_slots: after new token t, copy each GDN layer's state into state slot trail_slots[t] (t <
  // trail_slots.size()), so a verify pass can be rolled back to any accepted prefix; those tokens then run
  // through the GDN layers one at a time.
  bool hidden = false;
  std::span<const int32_t> trail_slots{};
};

struct ForwardOutput {
  // Row-major [rows, vocab]: for each step in order that did not ask for candidates, tokens.size() rows if
  // all_logits, else one row.
  std::vector<float> logits;
  int64_t rows = 0;
  // One per logits row of the steps that asked for candidates, in batch order (a step's rows in order).
  std::vector<LogitCandidates> candidates;
  // fetch_row(i, host): the full logits row behind candidates[i] (for what the candidates cannot decide).
  // Valid until the model's next forward.
  std::function<void(size_t, float*)> fetch_row;
  // Filled only when capture_hidden was asked for (batch of one): [num_layers + 1][tokens][hidden],
  // the embeddings, then each layer's output, the last one after the final norm (HF's hidden_states).
  std::vector<float> hidden_states;
  // [tokens][hidden], host memory: from SequenceRunner::prefill with `hidden`, every new token after the
  // final norm (the vector lm_head reads); from mtp_forward(), the rows whose logits it returns, after
  // mtp.norm.
  std::vector<float> hidden;
};

}  // namespace moeserve
