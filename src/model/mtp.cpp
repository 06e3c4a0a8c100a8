// The multi-token-prediction layer's forward pass (docs/qwen35-model.md §5), on the Backend like the model:
//
//   x = fc(cat[norm_e(embed(t_{p+1})), norm_h(h_p)])     embedding first, then the main model's hidden
//   x = decoder_layer(x, position p)                       full attention (own KV cache) + MoE
//   logits = lm_head(mtp.norm(x))                          shared lm_head; predicts t_{p+2}
//
// It reuses the model's attention and feed-forward code: the layer is the same kind as its full-attention
// layers, with KV layer 0 of the MTP cache.

#include "backend/backend.h"
#include "common/error.h"
#include "model/qwen35.h"

namespace moeserve {

void Qwen35Model::prepare_mtp() const {
  check(weights_.mtp.has_value(), "this checkpoint has no MTP layer (mtp.* tensors)");
  const MtpWeights& m = *weights_.mtp;
  backend_.prepare(m.fc);
  for (const auto* v : {&m.pre_fc_norm_embedding, &m.pre_fc_norm_hidden, &m.norm})
    backend_.prepare(v->data(), v->size());
  prepare_layer(m.layer);
}

KvCacheSpec Qwen35Model::mtp_kv_cache_spec(int page_size, int64_t num_pages) const {
  KvCacheSpec spec = kv_cache_spec(page_size, num_pages);
  spec.num_layers = 1;
  // One layer: its own FP8 scales (1.0 where the checkpoint has none), not the main stack's per-layer list.
  const AttentionWeights* attn = weights_.mtp ? &weights_.mtp->layer.attn : nullptr;
  spec.k_scales = {attn && attn->k_scale > 0 ? attn->k_scale : 1.0f};
  spec.v_scales = {attn && attn->v_scale > 0 ? attn->v_scale : 1.0f};
  return spec;
}

ForwardOutput Qwen35Model::mtp_forward(std::span<const SequenceStep> batch, std::span<const float> hidden,
                                       KvCache& mtp_kv) const {
  check(weights_.mtp.has_value(), "this checkpoint has no MTP layer (mtp.* tensors)");
  check(weights_.shard.size == 1, "the MTP layer runs without tensor parallelism");
  const MtpWeights& m = *weights_.mtp;
  const auto& c = config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  Backend& be = backend_;

  std::vector<int32_t> tokens;
  for (const auto& step : batch) {
    check(!step.tokens.empty(), "an MTP step needs at least one row");
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
  }
  const int64_t n = int64_t(tokens.size());
  check(int64_t(hidden.size()) == n * H, "the MTP layer got {} hidden values for {} rows of {}",
        hidden.size(), n, H);

  // [n][2H]: the normed embedding in the first half of each row, the normed hidden in the second.
  auto cat = be.allocate(size_t(n * 2 * H)), rows = be.allocate(size_t(n * H));
  be.embed(tokens, weights_.embed, rows.get());
  be.rms_norm(rows.get(), n, H, H, m.pre_fc_norm_embedding.data(), eps, true, cat.get(), 2 * H);
  be.upload(hidden.data(), rows.get(), size_t(n * H));
  be.rms_norm(rows.get(), n, H, H, m.pre_fc_norm_hidden.data(), eps, true, cat.get() + H, 2 * H);
  auto h = be.allocate(size_t(n * H)), x = be.allocate(size_t(n * H)), y = be.allocate(size_t(n * H));
  be.matmul(cat.get(), n, m.fc, h.get());

  const LayerWeights& lw = m.layer;
  be.rms_norm(h.get(), n, H, H, lw.input_norm.data(), eps, true, x.get(), H);
  gated_attention(lw, 0, x.get(), n, batch, mtp_kv, y.get());
  be.add_rms_norm(h.get(), y.get(), n, H, lw.post_norm.data(), eps, x.get());
  feed_forward(lw, x.get(), n, y.get());
  be.add(h.get(), y.get(), size_t(n * H));

  std::vector<int64_t> selected;
  int64_t row = 0;
  for (const auto& step : batch) {
    const int64_t T = int64_t(step.tokens.size());
    for (int64_t t = step.all_logits ? 0 : T - 1; t < T; ++t) selected.push_back(row + t);
    row += T;
  }
  const int64_t k = int64_t(selected.size());
  auto out = be.allocate(size_t(k * H)), logits = be.allocate(size_t(k * V));
  for (int64_t i = 0; i < k; ++i) be.copy(h.get() + selected[size_t(i)] * H, out.get() + i * H, size_t(H));
  be.rms_norm(out.get(), k, H, H, m.norm.data(), eps, true, out.get(), H);
  lm_head(out.get(), k, logits.get());

  ForwardOutput result;
  result.rows = k;
  result.logits.resize(size_t(k * V));
  be.download(logits.get(), result.logits.data(), result.logits.size());
  result.hidden.resize(size_t(k * H));
  be.download(out.get(), result.hidden.data(), result.hidden.size());
  return result;
}

}  // namespace moeserve
