#pragma once
// Qwen35Model: the Qwen3.5 forward pass (MoE and dense) over a batch of sequences, each either prefilling a
// chunk of its prompt or decoding. Reads and writes the paged KV cache (attention layers) and the GDN state
// slots. The layer sequence follows docs/qwen35-model.md §3; the arithmetic lives in the backend.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/forward_step.h"
#include "model/weights.h"
#include "storage/kv_cache.h"
#include "storage/state_cache.h"

namespace moeserve {
class Backend;
namespace dist {
class Communicator;
}
}  // namespace moeserve

namespace moeserve {

class Qwen35Model {
 public:
  // All must outlive the model. Sharded weights (model/tensor_parallel.h) need the communicator of their
  // group, whose rank and size they were cut for; every rank then runs forward() on the same batch.
  Qwen35Model(const ModelWeights& weights, Backend& backend, dist::Communicator* comm = nullptr);
  const ModelConfig& config() const { return weights_.config; }
  Backend& backend() const { return backend_; }

  // Cache shapes this model needs (page/slot counts are the caller's choice).
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages, DType dtype = DType::F32) const;
  StateCacheSpec state_cache_spec(int num_slots) const;

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state,
                        bool capture_hidden = false) const;

  // The MTP layer (model/mtp.cpp, docs/forward.md): present when the checkpoint has one.
  bool has_mtp() const { return weights_.mtp.has_value(); }
  // Moves the MTP weights where the backend runs (the constructor leaves them, as serving without
  // speculative decoding never reads them).
  void prepare_mtp() const;
  // The MTP layer's own KV cache: one attention layer, addressed by the same page tables as the model's.
  KvCacheSpec mtp_kv_cache_spec(int page_size, int64_t num_pages) const;
  // One MTP step over draft rows. A step's row p = (token t_{p+1}, position p, hidden h_p): its tokens are
  // the tokens after its positions [start_pos, start_pos + tokens.size()), `hidden` holds one row per token
  // of the batch (host memory: the model's final-normed hidden, or a previous step's ForwardOutput::hidden).
  // Each row predicts the token two ahead of its position. Returns the logits (last row per step, or every
  // row with all_logits) and, in `hidden`, the same rows after mtp.norm. The reference path (verify, tests).
  ForwardOutput mtp_forward(std::span<const SequenceStep> batch, std::span<const float> hidden,
                            KvCache& mtp_kv) const;
  // The serving path of the same step, with the hidden rows kept where the backend runs: row i of the batch
  // takes row hidden_rows[i] of the last forward()'s hidden rows (from_forward; SequenceStep::hidden, in
  // batch order) or of the previous mtp_draft's output rows (one per step, in batch order). Returns each
  // step's greedy draft (the argmax of its last row's logits, found where the logits are).
  std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch, std::span<const int64_t> hidden_rows,
                                 bool from_forward, KvCache& mtp_kv) const;
  // The final-normed hidden rows of the last forward() (those of its steps that asked for them, in batch
  // order), into host memory.
  void download_hidden(std::vector<float>& out) const;

 private:
  // candidates: the batch's candidate count (0: none); their records (Backend::logits_topk) go to *records.
  ForwardOutput forward_step(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state,
                             bool capture_hidden, int candidates, std::vector<float>* records) const;
  void gated_delta_net(const LayerWeights& lw, int gdn_layer, const float* x, int64_t n,
                       std::span<const SequenceStep> batch, StateCache& state, float* out) const;
  void gated_attention(const LayerWeights& lw, int attn_layer, const float* x, int64_t n,
                       std::span<const SequenceStep> batch, KvCache& kv, float* out) const;
  void feed_forward(const LayerWeights& lw, const float* x, int64_t n, float* out) const;
  void prepare_layer(const LayerWeights& lw) const;  // its weights where the backend runs
  // The final-normed rows h [tokens][hidden] of the steps that asked for them, into hidden_rows_.
  void final_hidden(std::span<const SequenceStep> batch, const float* h) const;
  // The MTP layer over the batch's n rows (their tokens; their hidden rows [n][hidden] where the backend
  // runs): fc over the normed embedding and hidden, the decoder layer, the residual stream (before mtp.norm)
  // into h [n][hidden]. The part mtp_forward and mtp_draft share.
  void mtp_layer(std::span<const SequenceStep> batch, const float* hidden, int64_t n, KvCache& mtp_kv,
                 float* h) const;
  // The rows of each step whose logits are asked for (its last row, or every row with all_logits).
  static std::vector<int64_t> logits_rows(std::span<const SequenceStep> batch);
  // Grows a buffer kept between steps to at least `need` floats (geometrically, at least `least`).
  void grow(Buffer& buffer, size_t& floats, size_t need, size_t least) const;

  // Tensor parallelism: the sum over ranks of a row-parallel layer's partial outputs, in place.
  void all_reduce(float* x, size_t n) const;
  void embed(std::span<const int32_t> tokens, float* out) const;
  // Images: each step's feature rows overwrite those rows' embeddings in `rows` ([Σ tokens][hidden], the
  // batch's rows in order, where the backend runs). The model's input and the MTP layer's.
  void place_features(std::span<const SequenceStep> batch, float* rows) const;
  void lm_head(const float* x, int64_t m, float* logits) const;

  const ModelWeights& weights_;
  Backend& backend_;
  dist::Communicator* comm_;
  ModelConfig local_;  // this rank's head counts and intermediate sizes (the full config without TP)
  std::vector<int> attention_index_;  // layer -> index among attention layers (KvCache layer), or -1
  std::vector<int> gdn_index_;        // layer -> index among GDN layers (StateCache layer), or -1
  std::vector<float> rope_inv_freq_;
  std::vector<uint8_t> mrope_axes_;  // per rotary frequency: which of a step's rope_positions rows it takes
  // cos/sin [T][rotary_dim/2] of a step's explicit M-RoPE positions.
  void mrope_table(const SequenceStep& step, std::vector<float>& cos, std::vector<float>& sin) const;
  // The last step's logits of the rows reduced to candidates, kept (in the backend's memory) for fetch_row.
  mutable Buffer candidate_logits_;
  mutable size_t candidate_logits_floats_ = 0;
  // The last forward's hidden rows (SequenceStep::hidden) and the last mtp_draft's output rows, kept in the
  // backend's memory for the next mtp_draft.
  mutable Buffer hidden_rows_, mtp_rows_;
  mutable size_t hidden_rows_floats_ = 0, mtp_rows_floats_ = 0;
  mutable int64_t hidden_count_ = 0, mtp_count_ = 0;
};

}  // namespace moeserve
