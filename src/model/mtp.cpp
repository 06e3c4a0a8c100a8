// The multi-token-prediction layer's forward pass (docs/qwen35-model.md §5), on the Backend like the model:
//
//   x = fc(cat[norm_e(embed(t_{p+1})), norm_h(h_p)])     embedding first, then the main model's hidden
//   x = decoder_layer(x, position p)                       full attention (own KV cache) + MoE
//   logits = lm_head(mtp.norm(x))                          shared lm_head; predicts t_{p+2}
//
// With images, embed(t_{p+1}) is what the model's input took at p + 1 (the image feature at an image row)
// and position p is the model's M-RoPE position of row p (SequenceStep's feature_rows and rope_positions).
//
// It reuses the model's attention and feed-forward code: the layer is the same kind as its full-attention
// layers, with KV layer 0 of the MTP cache.

#include "backend/backend.h"
#include "common/error.h"
#include "model/qwen35.h"

namespace moeserve {
namespace {

// Rows of one sequence in a first draft step recorded as a graph: a verify step's k + 1 at most (k <= 8,
// engine/speculative.h).
constexpr size_t kMaxFollowRows = 9;

}  // namespace

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

void Qwen35Model::mtp_layer(std::span<const SequenceStep> batch, const float* hidden, int64_t n,
                            KvCache& mtp_kv, float* h) const {
  const MtpWeights& m = *weights_.mtp;
  const int64_t H = config().hidden_size;
  const float eps = float(config().rms_norm_eps);
  Backend& be = backend_;
  std::vector<int32_t> tokens;
  for (const auto& step : batch) {
    check(!step.tokens.empty(), "an MTP step needs at least one row");
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
  }
  check(int64_t(tokens.size()) == n, "the MTP layer got {} hidden rows for {} tokens", n, tokens.size());

  // [n][2H]: the normed embedding in the first half of each row, the normed hidden in the second.
  auto cat = be.allocate(size_t(n * 2 * H)), x = be.allocate(size_t(n * H)), y = be.allocate(size_t(n * H));
  be.embed(tokens, weights_.embed, x.get());
  // A row whose next token is an image token embeds that token's image feature, as the model's input did.
  place_features(batch, x.get());
  be.rms_norm(x.get(), n, H, H, m.pre_fc_norm_embedding.data(), eps, true, cat.get(), 2 * H);
  be.rms_norm(hidden, n, H, H, m.pre_fc_norm_hidden.data(), eps, true, cat.get() + H, 2 * H);
  be.matmul(cat.get(), n, m.fc, h);

  const LayerWeights& lw = m.layer;
  be.rms_norm(h, n, H, H, lw.input_norm.data(), eps, true, x.get(), H);
  gated_attention(lw, 0, x.get(), n, batch, mtp_kv, y.get());
  be.add_rms_norm(h, y.get(), n, H, lw.post_norm.data(), eps, x.get());
  feed_forward(lw, x.get(), n, y.get());
  be.add(h, y.get(), size_t(n * H));
}

std::vector<int64_t> Qwen35Model::logits_rows(std::span<const SequenceStep> batch) {
  std::vector<int64_t> selected;
  int64_t row = 0;
  for (const auto& step : batch) {
    const int64_t T = int64_t(step.tokens.size());
    for (int64_t t = step.all_logits ? 0 : T - 1; t < T; ++t) selected.push_back(row + t);
    row += T;
  }
  return selected;
}

ForwardOutput Qwen35Model::mtp_forward(std::span<const SequenceStep> batch, std::span<const float> hidden,
                                       KvCache& mtp_kv) const {
  check(weights_.mtp.has_value(), "this checkpoint has no MTP layer (mtp.* tensors)");
  check(weights_.shard.size == 1, "the MTP layer runs without tensor parallelism");
  const int64_t H = config().hidden_size, V = config().vocab_size;
  Backend& be = backend_;
  const int64_t n = int64_t(hidden.size()) / H;
  check(int64_t(hidden.size()) == n * H, "the MTP layer got {} hidden values, not rows of {}", hidden.size(),
        H);
  auto rows = be.allocate(size_t(n * H)), h = be.allocate(size_t(n * H));
  be.upload(hidden.data(), rows.get(), size_t(n * H));
  mtp_layer(batch, rows.get(), n, mtp_kv, h.get());

  const std::vector<int64_t> selected = logits_rows(batch);
  const int64_t k = int64_t(selected.size());
  auto out = be.allocate(size_t(k * H)), logits = be.allocate(size_t(k * V));
  for (int64_t i = 0; i < k; ++i) be.copy(h.get() + selected[size_t(i)] * H, out.get() + i * H, size_t(H));
  be.rms_norm(out.get(), k, H, H, weights_.mtp->norm.data(), float(config().rms_norm_eps), true, out.get(),
              H);
  lm_head(out.get(), k, logits.get());

  ForwardOutput result;
  result.rows = k;
  result.logits.resize(size_t(k * V));
  be.download(logits.get(), result.logits.data(), result.logits.size());
  result.hidden.resize(size_t(k * H));
  be.download(out.get(), result.hidden.data(), result.hidden.size());
  return result;
}

std::vector<int32_t> Qwen35Model::mtp_draft(std::span<const SequenceStep> batch,
                                            std::span<const int64_t> hidden_rows, bool from_forward,
                                            KvCache& mtp_kv) const {
  check(weights_.mtp.has_value(), "this checkpoint has no MTP layer (mtp.* tensors)");
  check(weights_.shard.size == 1, "the MTP layer runs without tensor parallelism");
  const int64_t H = config().hidden_size, V = config().vocab_size;
  Backend& be = backend_;
  const float* source = from_forward ? hidden_rows_.get() : mtp_rows_.get();
  const int64_t available = from_forward ? hidden_count_ : mtp_count_;
  const int64_t n = int64_t(hidden_rows.size());
  for (int64_t r : hidden_rows)
    check(r >= 0 && r < available, "MTP hidden row {} of {} kept rows", r, available);
  const std::vector<int64_t> selected = logits_rows(batch);
  const int64_t k = int64_t(selected.size());
  // A chained step (one row per step, fed the previous step's rows in order) is the MTP layer's decode step:
  // the same device work for the same batch size, which the backend may record and replay (CUDA graphs) under
  // keys apart from the model's decode steps. Its output rows fit where the previous step's were.
  bool chained = !from_forward && k == n;
  for (int64_t i = 0; i < n && chained; ++i) {
    const SequenceStep& step = batch[size_t(i)];
    chained = hidden_rows[size_t(i)] == i && step.tokens.size() == 1 && step.rope_positions.empty() &&
              step.feature_rows.empty();
  }
  // The first step after decode and verify steps (each sequence's rows: the positions its step kept, at most
  // a verify step's) repeats the same device work for the same shape too. Its rows go to the layer as
  // one-row steps, which attention_decode takes with every position and page table staged (each row attends
  // up to its own position after all rows' K and V are written: the step's causal attention, as in a verify
  // step), so the recording does not depend on where the sequences are.
  bool follow = from_forward && !batch.empty();
  for (const SequenceStep& step : batch)
    follow = follow && step.start_pos > 0 && step.rope_positions.empty() && step.feature_rows.empty() &&
             !step.all_logits && step.tokens.size() <= kMaxFollowRows;
  std::vector<SequenceStep> rows_as_steps;
  if (follow) {
    for (const SequenceStep& step : batch)
      for (size_t t = 0; t < step.tokens.size(); ++t) {
        SequenceStep row = step;
        row.tokens = step.tokens.subspan(t, 1);
        row.start_pos = step.start_pos + int64_t(t);
        rows_as_steps.push_back(row);
      }
  }
  // dst row i = src row index[i] (device to device), a run of consecutive source rows in one copy.
  auto gather = [&](const float* src, std::span<const int64_t> index, float* dst) {
    const int64_t m = int64_t(index.size());
    for (int64_t i = 0; i < m;) {
      int64_t j = i + 1;
      while (j < m && index[size_t(j)] == index[size_t(j - 1)] + 1) ++j;
      be.copy(src + index[size_t(i)] * H, dst + i * H, size_t((j - i) * H));
      i = j;
    }
  };
  std::vector<int32_t> drafts(static_cast<size_t>(k));
  auto run = [&] {
    auto rows = be.allocate(size_t(n * H)), h = be.allocate(size_t(n * H));
    gather(source, hidden_rows, rows.get());
    mtp_layer(follow ? std::span<const SequenceStep>(rows_as_steps) : batch, rows.get(), n, mtp_kv, h.get());

    // The draft rows after mtp.norm stay for the next call (its hidden rows); their logits only give argmax.
    // (Grown after the gather, which may read the old rows; a chained step never grows them.)
    grow(mtp_rows_, mtp_rows_floats_, size_t(k * H), 0);
    mtp_count_ = k;
    gather(h.get(), selected, mtp_rows_.get());
    be.rms_norm(mtp_rows_.get(), k, H, H, weights_.mtp->norm.data(), float(config().rms_norm_eps), true,
                mtp_rows_.get(), H);
    auto logits = be.allocate(size_t(k * V));
    lm_head(mtp_rows_.get(), k, logits.get());
    be.argmax(logits.get(), k, V, drafts.data());
  };
  constexpr uint64_t kChainedDraftKey = uint64_t(1) << 48;  // decode steps: batch | candidates << 32
  // First steps: rows and sequences (at most 2^16 each). The gathers' row offsets are baked in and folded
  // into the signature: a batch whose kept rows keep changing runs eagerly, a steady one (batch 1, or every
  // sequence keeping as many) replays. Verify keys have bit 63 set.
  constexpr uint64_t kFollowDraftKey = uint64_t(1) << 49;
  if (chained) {
    be.run_step(kChainedDraftKey | uint64_t(n), run);
  } else if (follow) {
    grow(mtp_rows_, mtp_rows_floats_, size_t(k * H), 0);  // outside the recording, which bakes its address
    be.run_step(kFollowDraftKey | uint64_t(n) << 16 | uint64_t(batch.size()), run);
  } else {
    run();
  }
  return drafts;
}

}  // namespace moeserve
