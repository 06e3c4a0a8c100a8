#pragma once
// Verification of the forward pass against Hugging Face reference outputs (reference.safetensors, format in
// tests/fixtures/README.md): promptN cases compare the logits of every position (no cache); genN cases decode
// the reference's tokens through the caches (the decode path) and compare each step's logits and greedy
// token.
// verify_mtp_against_reference does the same for the MTP layer (mtp_reference.safetensors).

#include <string>
#include <vector>

#include "model/qwen35.h"

namespace moeserve {

class TensorSet;

struct VerifyOptions {
  double tolerance = 1e-3;            // max |Δlogit| allowed
  bool compare_layers = false;        // also compare prompt0.hidden_states layer by layer
  DType kv_cache_dtype = DType::F32;  // what the genN cases' KV cache stores
  // The tolerance times max(1, the case's largest |reference logit|): bf16 tensor-core matmuls round
  // relatively (2^-9 per rounding, docs/cuda.md), as the vision reference and the CUDA fixture tests bound
  // them.
  bool relative = false;
};

struct VerifyCase {
  std::string name;  // "prompt0", "gen1", ...
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;  // gen cases
  double max_abs_error = 0;
  double tolerance = 0;          // the bound max_abs_error was held to (VerifyOptions::relative)
  bool tokens_match = true;      // gen cases: every greedy token equal to the reference
  int64_t first_mismatch = -1;   // step of the first differing token
  int64_t token_mismatches = 0;  // steps whose greedy token differs from the reference's
};

struct LayerDiff {
  std::string
      name;  // "embeddings", "layer 0 (linear_attention)", ..., "layer 3 (full_attention) + final norm"
  double max_abs_error = 0;
};

struct VerifyReport {
  std::vector<VerifyCase> cases;
  std::vector<LayerDiff> layers;      // when compare_layers and the reference has prompt0.hidden_states
  std::string first_divergent_layer;  // empty when none exceeds the tolerance
  bool passed = false;
};

VerifyReport verify_against_reference(const Qwen35Model& model, const TensorSet& reference,
                                      const VerifyOptions& options);

// The MTP layer against mtp_reference.safetensors (its mtp_reference.json says what each key is): mtpN cases
// compare the MTP logits of every prompt row (one batched step from the reference's hidden states); chainN
// cases run the model's prefill, check its greedy token, and compare 3 chained greedy draft steps (logits and
// tokens) through the MTP KV cache. generated_tokens counts the drafts.
VerifyReport verify_mtp_against_reference(const Qwen35Model& model, const TensorSet& reference,
                                          const VerifyOptions& options);

}  // namespace moeserve
