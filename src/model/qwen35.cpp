// The Qwen3.5 layer sequence (docs/qwen35-model.md §3), written against the Backend interface.
//
//   h = embed(ids)
//   for each layer:  h += mixer(norm(h))       mixer = Gated DeltaNet or gated attention
//                    h += ffn(norm(h))         ffn = MoE (routed top-k + gated shared expert) or SwiGLU
//   logits = lm_head(norm(h))
//
// Matmuls run over every token of the batch at once; the sequence mixers run per sequence on their slice.

#include "model/qwen35.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "common/error.h"
#include "dist/communicator.h"

namespace moeserve {
namespace {

struct SequenceSlice {
  int64_t offset;  // first row of this sequence in the batch
  int64_t length;
};

}  // namespace

Qwen35Model::Qwen35Model(const ModelWeights& weights, Backend& backend, dist::Communicator* comm)
    : weights_(weights),
      backend_(backend),
      comm_(comm),
      local_(weights.shard.local_config(weights.config)),
      rope_inv_freq_(weights.config.rope_inv_freq()),
      mrope_axes_(weights.config.mrope_axes()) {
  const int ranks = comm ? comm->size() : 1;
  check(weights.shard.size == ranks && (!comm || weights.shard.rank == comm->rank()),
        "weights cut for tensor-parallel rank {} of {} run in a group where this is rank {} of {}",
        weights.shard.rank, weights.shard.size, comm ? comm->rank() : 0, ranks);
  int attention = 0, gdn = 0;
  for (auto type : weights.config.layer_types) {
    attention_index_.push_back(type == LayerType::FullAttention ? attention++ : -1);
    gdn_index_.push_back(type == LayerType::LinearAttention ? gdn++ : -1);
  }
  // Weights go where the backend runs now rather than inside the first step.
  backend.prepare(weights.embed);
  backend.prepare(weights.lm_head);
  backend.prepare(weights.final_norm.data(), weights.final_norm.size());
  backend.prepare(rope_inv_freq_.data(), rope_inv_freq_.size());
  for (const auto& lw : weights.layers) prepare_layer(lw);
}

void Qwen35Model::prepare_layer(const LayerWeights& lw) const {
  Backend& backend = backend_;
  auto prepare = [&](const std::vector<float>& v) { backend.prepare(v.data(), v.size()); };
  auto prepare_ffn = [&](const SwiGlu& f) {
    for (const Matrix* m : {&f.gate, &f.up, &f.down})
      if (!m->empty()) backend.prepare(*m);
  };
  prepare(lw.input_norm);
  prepare(lw.post_norm);
  if (lw.type == LayerType::LinearAttention) {
    for (const Matrix* m :
         {&lw.gdn.in_proj_qkv, &lw.gdn.in_proj_z, &lw.gdn.in_proj_b, &lw.gdn.in_proj_a, &lw.gdn.out_proj})
      backend.prepare(*m);
    for (const auto* v : {&lw.gdn.conv1d, &lw.gdn.dt_bias, &lw.gdn.a_log, &lw.gdn.norm}) prepare(*v);
  } else {
    for (const Matrix* m : {&lw.attn.q_proj, &lw.attn.k_proj, &lw.attn.v_proj, &lw.attn.o_proj})
      backend.prepare(*m);
    prepare(lw.attn.q_norm);
    prepare(lw.attn.k_norm);
  }
  if (config().is_moe) {
    backend.prepare(lw.moe.router);
    for (const auto& e : lw.moe.experts) prepare_ffn(e);
    prepare_ffn(lw.moe.shared);
    if (!lw.moe.shared_gate.empty()) backend.prepare(lw.moe.shared_gate);
  } else {
    prepare_ffn(lw.mlp);
  }
}

KvCacheSpec Qwen35Model::kv_cache_spec(int page_size, int64_t num_pages, DType dtype) const {
  const auto& c = local_;
  KvCacheSpec spec;
  spec.num_layers = c.count_layers(LayerType::FullAttention);
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.page_size = page_size;
  spec.num_pages = num_pages;
  spec.memory = backend_.cache_memory();
  spec.dtype = dtype;
  // The checkpoint's FP8 KV scales per attention layer, 1.0 where a layer has none (only an FP8 pool uses
  // them).
  for (const auto& l : weights_.layers) {
    if (l.type != LayerType::FullAttention) continue;
    spec.k_scales.push_back(l.attn.k_scale > 0 ? l.attn.k_scale : 1.0f);
    spec.v_scales.push_back(l.attn.v_scale > 0 ? l.attn.v_scale : 1.0f);
  }
  return spec;
}

StateCacheSpec Qwen35Model::state_cache_spec(int num_slots) const {
  const auto& c = local_;
  return {c.count_layers(LayerType::LinearAttention),
          c.linear_conv_dim(),
          c.linear_conv_kernel,
          c.linear_num_value_heads,
          c.linear_key_head_dim,
          c.linear_value_head_dim,
          num_slots,
          backend_.cache_memory()};
}

void Qwen35Model::gated_delta_net(const LayerWeights& lw, int gdn_layer, const float* x, int64_t n,
                                  std::span<const SequenceStep> batch, StateCache& state, float* out) const {
  const auto& c = local_;
  const auto& w = lw.gdn;
  const int64_t C = c.linear_conv_dim(), key_dim = c.linear_key_dim(), value_dim = c.linear_value_dim();
  const int Hv = c.linear_num_value_heads;
  Backend& be = backend_;
  auto qkv = be.allocate(size_t(n * C));
  auto z = be.allocate(size_t(n * value_dim)), core = be.allocate(size_t(n * value_dim));
  auto b = be.allocate(size_t(n * Hv)), a = be.allocate(size_t(n * Hv));
  const Matrix* in_proj[] = {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a};
  float* const in_out[] = {qkv.get(), z.get(), b.get(), a.get()};
  be.matmul_n(x, n, in_proj, in_out);

  const DeltaRuleShape shape{c.linear_num_key_heads, Hv, c.linear_key_head_dim, c.linear_value_head_dim};
  // Each sequence's state of this layer: in place in a float32 pool or in a backend's bf16 cache memory; from
  // a host bf16 pool, widened into float32 for this step and rounded back after it.
  const bool staged = !state.in_place();
  const int64_t conv_n = state.spec().conv_floats(), rec_n = state.spec().recurrent_floats();
  Buffer staging;
  if (staged) staging = be.allocate(batch.size() * size_t(conv_n + rec_n));
  std::vector<float*> conv_states, states;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int slot = batch[i].state_slot;
    if (staged) {
      float* s = staging.get() + i * size_t(conv_n + rec_n);
      state.load(gdn_layer, slot, s, s + conv_n);
      conv_states.push_back(s);
      states.push_back(s + conv_n);
    } else {
      conv_states.push_back(state.conv(gdn_layer, slot));
      states.push_back(state.recurrent(gdn_layer, slot));
    }
  }

  if (int64_t(batch.size()) == n) {  // decode: one token per sequence, all sequences at once
    be.gdn_decode(shape, qkv.get(), z.get(), b.get(), a.get(), n, w.conv1d.data(), c.linear_conv_kernel,
                  w.a_log.data(), w.dt_bias.data(), w.norm.data(), float(c.rms_norm_eps), conv_states, states,
                  core.get());
  } else {
    // The chunk ops' buffers and gates; a batch of verify steps only needs none (gdn_verify gates itself).
    Buffer conv, beta, g;
    if (std::any_of(batch.begin(), batch.end(),
                    [](const SequenceStep& s) { return s.trail_slots.empty(); })) {
      conv = be.allocate(size_t(n * C)), beta = be.allocate(size_t(n * Hv)), g = be.allocate(size_t(n * Hv));
      be.gdn_gates(b.get(), a.get(), w.a_log.data(), w.dt_bias.data(), n, Hv, beta.get(), g.get());
    }
    // Verify steps (a state kept after every token but the last) go through gdn_verify together, token by
    // token (the same arithmetic as plain decoding, so a verified token gets the logits it would have had);
    // the other sequences through the chunk ops, one by one.
    std::vector<int64_t> first_rows, lengths;
    std::vector<float*> verify_conv, verify_states;
    std::vector<int32_t> trail_slots, verify_slots;
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t T = int64_t(batch[i].tokens.size());
      if (!batch[i].trail_slots.empty()) {
        check(int64_t(batch[i].trail_slots.size()) == T - 1, "a verify step of {} tokens has {} trail slots",
              T, batch[i].trail_slots.size());
        first_rows.push_back(row);
        lengths.push_back(T);
        verify_conv.push_back(conv_states[i]);
        verify_states.push_back(states[i]);
        verify_slots.push_back(batch[i].state_slot);
        trail_slots.insert(trail_slots.end(), batch[i].trail_slots.begin(), batch[i].trail_slots.end());
        row += T;
        continue;
      }
      float* conv_rows = conv.get() + row * C;
      be.causal_conv1d_silu(qkv.get() + row * C, T, C, w.conv1d.data(), c.linear_conv_kernel, conv_states[i],
                            conv_rows);
      // conv output columns: q [0, key_dim), k [key_dim, 2 key_dim), v [2 key_dim, C)
      be.gated_delta_rule(shape, conv_rows, conv_rows + key_dim, C, conv_rows + 2 * key_dim, C,
                          g.get() + row * Hv, beta.get() + row * Hv, T, states[i],
                          core.get() + row * value_dim);
      row += T;
    }
    if (first_rows.empty()) {
      be.gated_rms_norm(core.get(), z.get(), n * Hv, c.linear_value_head_dim, w.norm.data(),
                        float(c.rms_norm_eps), core.get());
    } else {
      // gdn_verify norms its rows itself.
      row = 0;
      for (const auto& step : batch) {
        const int64_t T = int64_t(step.tokens.size());
        if (step.trail_slots.empty())
          be.gated_rms_norm(core.get() + row * value_dim, z.get() + row * value_dim, T * Hv,
                            c.linear_value_head_dim, w.norm.data(), float(c.rms_norm_eps),
                            core.get() + row * value_dim);
        row += T;
      }
      if (!staged) {
        std::vector<float*> conv_trails, trails;
        for (int32_t slot : trail_slots) {
          conv_trails.push_back(state.conv(gdn_layer, slot));
          trails.push_back(state.recurrent(gdn_layer, slot));
        }
        be.gdn_verify(shape, qkv.get(), z.get(), b.get(), a.get(), first_rows, lengths, w.conv1d.data(),
                      c.linear_conv_kernel, w.a_log.data(), w.dt_bias.data(), w.norm.data(),
                      float(c.rms_norm_eps), verify_conv, verify_states, conv_trails, trails, core.get());
      } else {
        // A host bf16 pool: plain decoding rounds the slot after every token, so each verified token runs
        // alone and its state goes through its trail slot (the last token's: the live slot) and back.
        size_t trail = 0;
        for (size_t v = 0; v < first_rows.size(); ++v)
          for (int64_t t = 0; t < lengths[v]; ++t) {
            const int64_t row_t = first_rows[v] + t, one = 1;
            be.gdn_verify(shape, qkv.get(), z.get(), b.get(), a.get(), {&row_t, 1}, {&one, 1},
                          w.conv1d.data(), c.linear_conv_kernel, w.a_log.data(), w.dt_bias.data(),
                          w.norm.data(), float(c.rms_norm_eps), {&verify_conv[v], 1}, {&verify_states[v], 1},
                          {}, {}, core.get());
            const int32_t slot = t + 1 < lengths[v] ? trail_slots[trail++] : verify_slots[v];
            state.store(gdn_layer, slot, verify_conv[v], verify_states[v]);
            state.load(gdn_layer, slot, verify_conv[v], verify_states[v]);
          }
      }
    }
  }
  if (staged)
    for (size_t i = 0; i < batch.size(); ++i)
      state.store(gdn_layer, batch[i].state_slot, conv_states[i], states[i]);
  be.matmul(core.get(), n, w.out_proj, out);
}

void Qwen35Model::gated_attention(const LayerWeights& lw, int attn_layer, const float* x, int64_t n,
                                  std::span<const SequenceStep> batch, KvCache& kv, float* out) const {
  const auto& c = local_;
  const auto& w = lw.attn;
  const int H = c.num_heads, KVH = c.num_kv_heads, hd = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  Backend& be = backend_;
  auto qg = be.allocate(size_t(n * H * 2 * hd));  // per head: hd query values, then hd gate values
  auto attn = be.allocate(size_t(n * H * hd));
  auto k = be.allocate(size_t(n * KVH * hd)), v = be.allocate(size_t(n * KVH * hd));
  const Matrix* qkv_proj[] = {&w.q_proj, &w.k_proj, &w.v_proj};
  float* const qkv_out[] = {qg.get(), k.get(), v.get()};
  be.matmul_n(x, n, qkv_proj, qkv_out);

  // Decode: one token per sequence, all sequences at once. Text after an image rotates rope_delta behind its
  // cache index (the same on all three M-RoPE axes), an offset attention_decode takes; explicit positions
  // (image tokens) take the per-sequence path below. A verify step's k+1 tokens go as k+1 such rows of one
  // sequence (positions in order, one page table): every row's K and V are written before any row attends,
  // and each attends to positions up to its own, so this is the step's causal attention, with a plain decode
  // step's arithmetic.
  const bool fused_decode = std::all_of(batch.begin(), batch.end(), [](const auto& s) {
    return s.rope_positions.empty() && (s.tokens.size() == 1 || !s.trail_slots.empty());
  });
  if (fused_decode) {
    std::vector<int64_t> positions, offsets;
    std::vector<std::span<const int32_t>> pages;
    for (const SequenceStep& step : batch)
      for (int64_t t = 0; t < int64_t(step.tokens.size()); ++t)
        positions.push_back(step.start_pos + t), offsets.push_back(step.rope_delta),
            pages.push_back(step.pages);
    be.attention_decode(qg.get(), k.get(), v.get(), n, H, KVH, hd, w.q_norm.data(), w.k_norm.data(), eps,
                        c.rotary_dim(), rope_inv_freq_.data(), positions, offsets, pages, kv, attn_layer,
                        attn.get());
  } else {
    auto q = be.allocate(size_t(n * H * hd));
    be.rms_norm(qg.get(), n * H, hd, 2 * hd, w.q_norm.data(), eps, true, q.get(), hd);
    be.rms_norm(k.get(), n * KVH, hd, hd, w.k_norm.data(), eps, true, k.get(), hd);
    int64_t row = 0;
    for (const auto& step : batch) {
      const int64_t T = int64_t(step.tokens.size());
      float* qs = q.get() + row * H * hd;
      float* ks = k.get() + row * KVH * hd;
      if (step.rope_positions.empty()) {
        be.rope(qs, T, H, hd, c.rotary_dim(), step.start_pos + step.rope_delta, rope_inv_freq_.data());
        be.rope(ks, T, KVH, hd, c.rotary_dim(), step.start_pos + step.rope_delta, rope_inv_freq_.data());
      } else {
        std::vector<float> cos, sin;
        mrope_table(step, cos, sin);
        auto table = be.allocate(cos.size() + sin.size());  // [cos | sin], in the backend's memory
        be.upload(cos.data(), table.get(), cos.size());
        be.upload(sin.data(), table.get() + cos.size(), sin.size());
        const float* tc = table.get();
        const float* ts = table.get() + cos.size();
        be.rope_table(qs, T, int64_t(H) * hd, H, hd, c.rotary_dim(), tc, ts);
        be.rope_table(ks, T, int64_t(KVH) * hd, KVH, hd, c.rotary_dim(), tc, ts);
      }
      be.paged_attention(qs, ks, v.get() + row * KVH * hd, T, H, KVH, hd, step.start_pos, step.pages, kv,
                         attn_layer, attn.get() + row * H * hd);
      row += T;
    }
  }
  be.mul_sigmoid(attn.get(), qg.get() + hd, n * H, hd, 2 * hd);
  be.matmul(attn.get(), n, w.o_proj, out);
}

void Qwen35Model::place_features(std::span<const SequenceStep> batch, float* rows) const {
  const int64_t H = config().hidden_size;
  int64_t first_row = 0;
  for (const auto& step : batch) {
    check(step.features.size() == step.feature_rows.size() * size_t(H), "{} image feature values for {} rows",
          step.features.size(), step.feature_rows.size());
    // Consecutive rows (one image's tokens) go up in one upload.
    for (size_t i = 0; i < step.feature_rows.size();) {
      size_t j = i + 1;
      while (j < step.feature_rows.size() && step.feature_rows[j] == step.feature_rows[j - 1] + 1) ++j;
      check(step.feature_rows[i] >= 0 && size_t(step.feature_rows[j - 1]) < step.tokens.size(),
            "image feature rows outside the step");
      backend_.upload(step.features.data() + i * size_t(H), rows + (first_row + step.feature_rows[i]) * H,
                      (j - i) * size_t(H));
      i = j;
    }
    first_row += int64_t(step.tokens.size());
  }
}

void Qwen35Model::mrope_table(const SequenceStep& step, std::vector<float>& cos,
                              std::vector<float>& sin) const {
  const int64_t T = int64_t(step.tokens.size());
  const size_t half = rope_inv_freq_.size();
  check(int64_t(step.rope_positions.size()) == 3 * T, "M-RoPE positions: {} values for {} tokens",
        step.rope_positions.size(), T);
  cos.resize(size_t(T) * half);
  sin.resize(size_t(T) * half);
  for (int64_t t = 0; t < T; ++t)
    for (size_t i = 0; i < half; ++i) {
      // float32 position times float32 frequency, as HF's rotary computes it.
      const float angle = float(step.rope_positions[size_t(mrope_axes_[i] * T + t)]) * rope_inv_freq_[i];
      cos[size_t(t) * half + i] = std::cos(angle);
      sin[size_t(t) * half + i] = std::sin(angle);
    }
}

void Qwen35Model::feed_forward(const LayerWeights& lw, const float* x, int64_t n, float* out) const {
  const auto& c = local_;
  Backend& be = backend_;
  if (!c.is_moe) {
    be.swiglu(lw.mlp, x, n, out);
    return;
  }
  const auto& moe = lw.moe;
  const bool shared = !moe.shared.gate.empty();
  be.moe_block(moe.router, moe.experts, c.num_experts_per_tok, c.norm_topk_prob,
               shared ? &moe.shared : nullptr, shared ? &moe.shared_gate : nullptr, x, n, c.hidden_size, out);
}

ForwardOutput Qwen35Model::forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state,
                                   bool capture_hidden) const {
  const int64_t V = config().vocab_size;
  int k = 0;
  size_t reduced = 0;
  for (const auto& s : batch) {
    if (s.candidates <= 0) continue;
    check(k == 0 || k == s.candidates,
          "every step of a batch asks for the same number of candidates ({} and {})", k, s.candidates);
    check(s.candidates <= kMaxLogitsTopk, "at most {} logit candidates per row, not {}", kMaxLogitsTopk,
          s.candidates);
    check(s.temperature > 0 && std::isfinite(s.temperature), "candidates need a temperature > 0, not {}",
          s.temperature);
    k = s.candidates;
    reduced += s.all_logits ? s.tokens.size() : 1;
  }
  // The reduced rows' logits stay in the backend's memory for fetch_row, the hidden rows for mtp_draft.
  // Allocated here, outside a recorded step, and only ever grown (geometrically): a recording bakes their
  // address in.
  grow(candidate_logits_, candidate_logits_floats_, reduced * size_t(V), size_t(64 * V));
  size_t hidden_rows = 0;
  for (const auto& s : batch) hidden_rows += s.hidden ? s.tokens.size() : 0;
  grow(hidden_rows_, hidden_rows_floats_, hidden_rows * size_t(config().hidden_size), 0);
  hidden_count_ = int64_t(hidden_rows);

  // Decode steps (one new token per sequence) of the same batch size repeat the same device work, so the
  // backend may record and replay them (CUDA graphs); prefill chunks vary and run directly. A sequence with
  // images decodes in the same recording (its rope_delta is a staged input of attention_decode); a one-token
  // prefill chunk with explicit M-RoPE positions is not a decode step.
  const bool decode = !capture_hidden && std::all_of(batch.begin(), batch.end(), [](const SequenceStep& s) {
    return s.tokens.size() == 1 && s.start_pos > 0 && !s.all_logits && !s.hidden && s.rope_positions.empty();
  });
  // Speculative verify batches (each step a verify step of k+1 tokens or a decode step) repeat the same
  // device work for the same shape too (every position, slot and page table a staged input): recorded under a
  // key of their shape, apart from decode keys.
  const bool verify =
      !decode && !capture_hidden &&
      std::any_of(batch.begin(), batch.end(), [](const SequenceStep& s) { return !s.trail_slots.empty(); }) &&
      std::all_of(batch.begin(), batch.end(), [](const SequenceStep& s) {
        const bool verifies = !s.trail_slots.empty() && s.all_logits;
        return s.start_pos > 0 && s.rope_positions.empty() && s.feature_rows.empty() &&
               (verifies || (s.tokens.size() == 1 && !s.all_logits));
      });
  ForwardOutput result;
  std::vector<float> records;
  if (decode) {
    const uint64_t key = uint64_t(batch.size()) | uint64_t(k) << 32;
    backend_.run_step(key, [&] { result = forward_step(batch, kv, state, false, k, &records); });
  } else if (verify) {
    uint64_t shape = 0xcbf29ce484222325ull;  // FNV-1a over the candidates and each step's rows and outputs
    auto mix = [&](uint64_t v) { shape = (shape ^ v) * 0x100000001b3ull; };
    mix(uint64_t(k));
    for (const auto& s : batch) mix(uint64_t(s.tokens.size()) << 2 | uint64_t(s.hidden) << 1 | s.all_logits);
    const uint64_t key = shape | uint64_t(1) << 63;  // decode keys stay below 2^41
    backend_.run_step(key, [&] { result = forward_step(batch, kv, state, false, k, &records); });
  } else {
    result = forward_step(batch, kv, state, capture_hidden, k, &records);
  }
  if (reduced == 0) return result;

  const int64_t stride = logits_topk_record_floats(k);
  result.candidates.resize(reduced);
  for (size_t i = 0; i < reduced; ++i)
    result.candidates[i] = read_logit_candidates(records.data() + int64_t(i) * stride, k, V);
  result.fetch_row = [this, V](size_t i, float* host) {
    backend_.download(candidate_logits_.get() + int64_t(i) * V, host, size_t(V));
  };
  return result;
}

ForwardOutput Qwen35Model::forward_step(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state,
                                        bool capture_hidden, int candidates,
                                        std::vector<float>* records) const {
  const auto& c = config();
  const int64_t H = c.hidden_size;
  Backend& be = backend_;
  check(!capture_hidden || batch.size() == 1, "hidden-state capture works on a batch of one sequence");

  std::vector<int32_t> tokens;
  for (const auto& step : batch) {
    check(!step.tokens.empty(), "a sequence step needs at least one token");
    tokens.insert(tokens.end(), step.tokens.begin(), step.tokens.end());
    // A sequence starting at position 0 starts from a zero recurrent and conv state.
    if (step.start_pos == 0) state.clear_slot(step.state_slot);
  }
  const int64_t n = int64_t(tokens.size());

  ForwardOutput result;
  auto h = be.allocate(size_t(n * H)), x = be.allocate(size_t(n * H)), y = be.allocate(size_t(n * H));
  embed(tokens, h.get());
  place_features(batch, h.get());
  auto capture = [&](const float* rows) {
    if (!capture_hidden) return;
    result.hidden_states.resize(result.hidden_states.size() + size_t(n * H));
    be.download(rows, result.hidden_states.data() + result.hidden_states.size() - size_t(n * H),
                size_t(n * H));
  };
  capture(h.get());

  const float eps = float(c.rms_norm_eps);
  for (int l = 0; l < c.num_layers; ++l) {
    const auto& lw = weights_.layers[l];
    // x = input_norm(h); after layer 0 the previous layer's last residual add produced it already.
    if (l == 0 || capture_hidden) be.rms_norm(h.get(), n, H, H, lw.input_norm.data(), eps, true, x.get(), H);
    if (lw.type == LayerType::LinearAttention) {
      gated_delta_net(lw, gdn_index_[l], x.get(), n, batch, state, y.get());
    } else {
      gated_attention(lw, attention_index_[l], x.get(), n, batch, kv, y.get());
    }
    all_reduce(y.get(), size_t(n * H));
    be.add_rms_norm(h.get(), y.get(), n, H, lw.post_norm.data(), eps, x.get());
    feed_forward(lw, x.get(), n, y.get());
    all_reduce(y.get(), size_t(n * H));
    // The residual add of the last feed-forward goes with the next layer's input norm (or the final norm).
    if (l + 1 < c.num_layers && !capture_hidden) {
      be.add_rms_norm(h.get(), y.get(), n, H, weights_.layers[l + 1].input_norm.data(), eps, x.get());
      continue;
    }
    be.add(h.get(), y.get(), size_t(n * H));
    if (l + 1 < c.num_layers) capture(h.get());
  }

  // Only the rows whose logits were asked for go through the final norm and the (large) lm_head: first the
  // rows of the steps that want candidates (the last row, or every row with all_logits), then the full rows,
  // each group in batch order.
  std::vector<int64_t> rows;
  std::vector<float> temperatures;
  auto add_rows = [&](bool want_candidates) {
    int64_t row = 0;
    for (const auto& step : batch) {
      const int64_t T = int64_t(step.tokens.size());
      if ((candidates > 0 && step.candidates > 0) == want_candidates)
        for (int64_t t = step.all_logits ? 0 : T - 1; t < T; ++t) {
          rows.push_back(row + t);
          if (want_candidates) temperatures.push_back(step.temperature);
        }
      row += T;
    }
  };
  add_rows(true);
  const int64_t reduced = int64_t(rows.size());
  add_rows(false);
  if (capture_hidden) {
    be.rms_norm(h.get(), n, H, H, weights_.final_norm.data(), eps, true, x.get(), H);
    capture(x.get());
  }
  final_hidden(batch, h.get());
  const int64_t m = int64_t(rows.size()), V = c.vocab_size;
  auto selected = be.allocate(size_t(m * H));
  for (int64_t i = 0; i < m;) {  // a run of consecutive rows in one copy
    int64_t j = i + 1;
    while (j < m && rows[size_t(j)] == rows[size_t(j - 1)] + 1) ++j;
    be.copy(h.get() + rows[size_t(i)] * H, selected.get() + i * H, size_t((j - i) * H));
    i = j;
  }
  be.rms_norm(selected.get(), m, H, H, weights_.final_norm.data(), eps, true, selected.get(), H);
  if (reduced > 0) {
    lm_head(selected.get(), reduced, candidate_logits_.get());
    const int64_t stride = logits_topk_record_floats(candidates);
    auto rec = be.allocate(size_t(reduced * stride));
    be.logits_topk(candidate_logits_.get(), reduced, V, temperatures, candidates, rec.get());
    records->resize(size_t(reduced * stride));
    be.download(rec.get(), records->data(), records->size());
  }
  result.rows = m - reduced;
  if (result.rows > 0) {
    auto logits = be.allocate(size_t(result.rows * V));
    lm_head(selected.get() + reduced * H, result.rows, logits.get());
    result.logits.resize(size_t(result.rows * V));
    be.download(logits.get(), result.logits.data(), result.logits.size());
  }
  return result;
}

void Qwen35Model::grow(Buffer& buffer, size_t& floats, size_t need, size_t least) const {
  if (need <= floats) return;
  buffer.reset();
  floats = std::max({need, 2 * floats, least});
  buffer = backend_.allocate(floats);
}

void Qwen35Model::final_hidden(std::span<const SequenceStep> batch, const float* h) const {
  const int64_t H = config().hidden_size;
  int64_t row = 0, at = 0;
  for (const auto& step : batch) {
    const int64_t T = int64_t(step.tokens.size());
    if (step.hidden) {
      backend_.rms_norm(h + row * H, T, H, H, weights_.final_norm.data(), float(config().rms_norm_eps), true,
                        hidden_rows_.get() + at * H, H);
      at += T;
    }
    row += T;
  }
}

void Qwen35Model::download_hidden(std::vector<float>& out) const {
  out.resize(size_t(hidden_count_ * config().hidden_size));
  if (!out.empty()) backend_.download(hidden_rows_.get(), out.data(), out.size());
}

void Qwen35Model::all_reduce(float* x, size_t n) const {
  if (comm_ && comm_->size() > 1) comm_->all_reduce_sum(x, n);
}

void Qwen35Model::embed(std::span<const int32_t> tokens, float* out) const {
  Backend& be = backend_;
  const auto& s = weights_.shard;
  if (s.size == 1) {
    be.embed(tokens, weights_.embed, out);
    return;
  }
  // Vocab-parallel: each rank looks up every token in its slice (ids outside it clamped to row 0) and keeps
  // only its own through a 0/1 row gate (sigmoid(±1e4) is exactly 0 or 1), so the all-reduce assembles each
  // row from one rank's row plus zeros, exactly. The ops do not depend on which tokens fall where, so a
  // recorded decode step replays for any tokens.
  const int64_t H = config().hidden_size, n = int64_t(tokens.size());
  std::vector<int32_t> local(tokens.size());
  std::vector<float> gate(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool mine = tokens[i] >= s.vocab_begin && tokens[i] < s.vocab_begin + s.vocab_rows;
    local[i] = mine ? int32_t(tokens[i] - s.vocab_begin) : 0;
    gate[i] = mine ? 1e4f : -1e4f;
  }
  auto rows = be.allocate(size_t(n * H)), gate_logits = be.allocate(size_t(n));
  be.embed(local, weights_.embed, rows.get());
  be.upload(gate.data(), gate_logits.get(), gate.size());
  be.fill_zero(out, size_t(n * H));
  be.add_sigmoid_gated(out, rows.get(), gate_logits.get(), n, H);
  all_reduce(out, size_t(n * H));
}

void Qwen35Model::lm_head(const float* x, int64_t m, float* logits) const {
  Backend& be = backend_;
  const auto& s = weights_.shard;
  const int64_t V = config().vocab_size;
  if (s.size == 1) {
    be.matmul(x, m, weights_.lm_head, logits);
    return;
  }
  // Vocab-parallel: each rank's [m][its rows] block, padded to the common chunk for the all-gather, then
  // laid side by side into [m][vocab] where the backend runs.
  const int64_t block = m * s.vocab_chunk;
  auto local = be.allocate(size_t(block)), gathered = be.allocate(size_t(block * s.size));
  be.matmul(x, m, weights_.lm_head, local.get());
  comm_->all_gather(local.get(), size_t(block), gathered.get());
  for (int r = 0; r < s.size; ++r) {
    const int64_t begin = std::min(V, r * s.vocab_chunk), rows = std::min(V, begin + s.vocab_chunk) - begin;
    const float* src = gathered.get() + r * block;
    for (int64_t i = 0; i < m; ++i) be.copy(src + i * rows, logits + i * V + begin, size_t(rows));
  }
}

}  // namespace moeserve
