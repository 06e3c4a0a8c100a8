#include "deploy/footprint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "deploy/units.h"

namespace moeserve::deploy {
namespace {

using nlohmann::json;

struct PresetShape {
  const char* name;
  int64_t hidden;
  int layers;
  int heads, kv_heads;
  int lin_k_heads, lin_v_heads;
  int experts, top_k;
  int64_t moe_inter, shared_inter;
};

// docs/qwen35-model.md §1 (text model only; the vision tower and MTP head are not served here).
constexpr PresetShape kPresets[] = {
    {"qwen3.5-35b-a3b", 2048, 40, 16, 2, 16, 32, 256, 8, 512, 512},
    {"qwen3.5-122b-a10b", 3072, 48, 32, 2, 16, 64, 256, 8, 1024, 1024},
    {"qwen3.5-397b-a17b", 4096, 60, 32, 2, 16, 64, 512, 10, 1024, 1024},
};

// Tensors a checkpoint keeps in BF16 even when it is FP8 (the Qwen3.5 FP8 releases' modules_to_not_convert).
const std::vector<std::string> kFp8KeptHigh = {"lm_head",   "embed_tokens", "mlp.gate", "shared_expert_gate",
                                               "in_proj_a", "in_proj_b"};

bool kept_high(const std::string& name, const std::vector<std::string>& keep) {
  return std::any_of(keep.begin(), keep.end(), [&](const std::string& k) {
    // "mlp.gate" must not match "mlp.gate_proj" or "mlp.experts...gate_proj": match whole name components.
    size_t at = name.find(k);
    while (at != std::string::npos) {
      size_t end = at + k.size();
      if (end == name.size() || name[end] == '.') return true;
      at = name.find(k, at + 1);
    }
    return false;
  });
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

std::optional<ModelConfig> model_preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    json c = {{"model_type", "qwen3_5_moe_text"},
              {"vocab_size", 248320},
              {"hidden_size", p.hidden},
              {"num_hidden_layers", p.layers},
              {"full_attention_interval", 4},
              {"num_attention_heads", p.heads},
              {"num_key_value_heads", p.kv_heads},
              {"head_dim", 256},
              {"linear_num_key_heads", p.lin_k_heads},
              {"linear_num_value_heads", p.lin_v_heads},
              {"linear_key_head_dim", 128},
              {"linear_value_head_dim", 128},
              {"linear_conv_kernel_dim", 4},
              {"num_experts", p.experts},
              {"num_experts_per_tok", p.top_k},
              {"moe_intermediate_size", p.moe_inter},
              {"shared_expert_intermediate_size", p.shared_inter},
              {"max_position_embeddings", 262144},
              {"tie_word_embeddings", false}};
    return ModelConfig::from_json(c);
  }
  return std::nullopt;
}

std::string known_model_presets() {
  std::string out;
  for (const auto& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

std::vector<TensorGroup> tensor_inventory(const ModelConfig& c) {
  using Split = TensorGroup::Split;
  std::vector<TensorGroup> t;
  auto add = [&](std::string name, int64_t rows, int64_t cols, int64_t count, bool projection,
                 Split split = Split::ByTp) {
    if (count > 0 && rows > 0) t.push_back({std::move(name), rows, cols, count, projection, split});
  };
  const int64_t h = c.hidden_size;
  const int64_t gdn = c.count_layers(LayerType::LinearAttention);
  const int64_t attn = c.count_layers(LayerType::FullAttention);
  const int64_t layers = c.num_layers;

  add("embed_tokens.weight", c.vocab_size, h, 1, true);
  if (!c.tie_word_embeddings) add("lm_head.weight", c.vocab_size, h, 1, true);
  add("norm.weight", h, 1, 1, false, Split::Replicated);
  add("layers.N.input_layernorm.weight", h, 1, layers, false, Split::Replicated);
  add("layers.N.post_attention_layernorm.weight", h, 1, layers, false, Split::Replicated);

  // Gated DeltaNet layers.
  const int64_t hv = c.linear_num_value_heads;
  add("layers.N.linear_attn.in_proj_qkv.weight", c.linear_conv_dim(), h, gdn, true);
  add("layers.N.linear_attn.in_proj_z.weight", c.linear_value_dim(), h, gdn, true);
  add("layers.N.linear_attn.in_proj_b.weight", hv, h, gdn, true);
  add("layers.N.linear_attn.in_proj_a.weight", hv, h, gdn, true);
  add("layers.N.linear_attn.conv1d.weight", c.linear_conv_dim(), c.linear_conv_kernel, gdn, false);
  add("layers.N.linear_attn.dt_bias", hv, 1, gdn, false);
  add("layers.N.linear_attn.A_log", hv, 1, gdn, false);
  add("layers.N.linear_attn.norm.weight", c.linear_value_head_dim, 1, gdn, false, Split::Replicated);
  add("layers.N.linear_attn.out_proj.weight", h, c.linear_value_dim(), gdn, true);

  // Gated attention layers: q_proj carries the query and its output gate.
  const int64_t hd = c.head_dim;
  add("layers.N.self_attn.q_proj.weight", int64_t(c.num_heads) * hd * 2, h, attn, true);
  add("layers.N.self_attn.k_proj.weight", int64_t(c.num_kv_heads) * hd, h, attn, true, Split::KvHeads);
  add("layers.N.self_attn.v_proj.weight", int64_t(c.num_kv_heads) * hd, h, attn, true, Split::KvHeads);
  add("layers.N.self_attn.o_proj.weight", h, int64_t(c.num_heads) * hd, attn, true);
  add("layers.N.self_attn.q_norm.weight", hd, 1, attn, false, Split::Replicated);
  add("layers.N.self_attn.k_norm.weight", hd, 1, attn, false, Split::Replicated);

  if (c.is_moe) {
    const int64_t experts = int64_t(c.num_experts) * layers;
    add("layers.N.mlp.gate.weight", c.num_experts, h, layers, true, Split::Replicated);
    add("layers.N.mlp.experts.E.gate_proj.weight", c.moe_intermediate_size, h, experts, true);
    add("layers.N.mlp.experts.E.up_proj.weight", c.moe_intermediate_size, h, experts, true);
    add("layers.N.mlp.experts.E.down_proj.weight", h, c.moe_intermediate_size, experts, true);
    if (c.shared_expert_intermediate_size > 0) {
      add("layers.N.mlp.shared_expert.gate_proj.weight", c.shared_expert_intermediate_size, h, layers, true);
      add("layers.N.mlp.shared_expert.up_proj.weight", c.shared_expert_intermediate_size, h, layers, true);
      add("layers.N.mlp.shared_expert.down_proj.weight", h, c.shared_expert_intermediate_size, layers, true);
      add("layers.N.mlp.shared_expert_gate.weight", 1, h, layers, true, Split::Replicated);
    }
  } else {
    add("layers.N.mlp.gate_proj.weight", c.intermediate_size, h, layers, true);
    add("layers.N.mlp.up_proj.weight", c.intermediate_size, h, layers, true);
    add("layers.N.mlp.down_proj.weight", h, c.intermediate_size, layers, true);
  }
  return t;
}

void validate_precision(const Precision& p, const std::string& where) {
  check(p.weights == "bf16" || p.weights == "fp8", "{}: dtype '{}' is not supported (use bf16 or fp8)", where,
        p.weights);
  check(p.kv == "fp32" || p.kv == "bf16" || p.kv == "fp8",
        "{}: kv_cache_dtype '{}' is not supported (use auto, bf16, fp8 or fp32)", where, p.kv);
  check(p.state == "fp32" || p.state == "bf16", "{}: state_dtype '{}' is not supported (use fp32 or bf16)",
        where, p.state);
}

std::string kv_precision(const std::string& d, bool gpu, const std::string& where) {
  if (d == "auto") return gpu ? "bf16" : "fp32";
  if (d == "bfloat16" || d == "bf16") return "bf16";
  if (d == "fp8" || d == "fp8_e4m3") return "fp8";
  if (d == "float32" || d == "fp32") return "fp32";
  fail("{}: kv_cache_dtype '{}' is not one of auto, bf16 (bfloat16), fp8 (fp8_e4m3), fp32 (float32)", where,
       d);
}

double bytes_of(const std::string& dtype) {
  if (dtype == "fp8") return 1;
  if (dtype == "bf16") return 2;
  if (dtype == "fp32") return 4;
  return 0;
}

double rank_bytes(const TensorGroup& g, const ModelConfig& c, const Precision& p, int tp) {
  const auto& keep = c.fp8 ? c.fp8->modules_to_not_convert : kFp8KeptHigh;
  const int64_t block_out = c.fp8 ? c.fp8->block_out : 128, block_in = c.fp8 ? c.fp8->block_in : 128;
  double bytes = 0;
  if (p.weights == "fp8" && g.projection && !kept_high(g.name, keep))
    bytes = double(g.rows * g.cols) + 4.0 * double(ceil_div(g.rows, block_out) * ceil_div(g.cols, block_in));
  else
    bytes = 2.0 * double(g.rows * g.cols);
  bytes *= double(g.count);
  switch (g.split) {
    case TensorGroup::Split::ByTp:
      return bytes / tp;
    case TensorGroup::Split::KvHeads:  // fewer KV heads than ranks: replicated
      return bytes * double(ceil_div(c.num_kv_heads, tp)) / c.num_kv_heads;
    case TensorGroup::Split::Replicated:
      break;
  }
  return bytes;
}

Footprint footprint(const ModelConfig& c, const Precision& p, int tp, int prefill_chunk, int max_running) {
  check(tp >= 1, "tensor-parallel size must be at least 1");
  Footprint f;
  const int64_t kv_per_rank = ceil_div(c.num_kv_heads, tp);  // fewer KV heads than ranks: replicated
  for (const auto& g : tensor_inventory(c)) f.weights += rank_bytes(g, c, p, tp);

  const int attn = c.count_layers(LayerType::FullAttention);
  const int gdn = c.count_layers(LayerType::LinearAttention);
  f.kv_per_token = double(attn) * 2 * double(kv_per_rank) * c.head_dim * bytes_of(p.kv);
  const double hv = double(c.linear_num_value_heads) / tp;
  f.state_per_sequence =
      double(gdn) * (hv * c.linear_key_head_dim * c.linear_value_head_dim * bytes_of(p.state) +
                     double(c.linear_conv_dim()) / tp * (c.linear_conv_kernel - 1) * bytes_of(p.state));

  // Working memory: ~1 GiB of CUDA context, cuBLAS and NCCL buffers; fp32 activations of one prefill chunk
  // (the residual stream and its norms, the widest projection output, the routed experts' gate/up outputs);
  // fp32 logits for every running sequence.
  const double widest =
      std::max(double(c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads),
               double(2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim)) /
      tp;
  const double moe =
      c.is_moe ? 2.0 * c.num_experts_per_tok * c.moe_intermediate_size / tp : 2.0 * c.intermediate_size / tp;
  const double per_token = 4.0 * (4.0 * c.hidden_size + widest + moe);
  f.workspace = 1024.0 * 1024 * 1024 + prefill_chunk * per_token + 4.0 * max_running * c.vocab_size / tp;
  return f;
}

std::string FitResult::breakdown() const {
  return fmt::format("weights {} + KV {} + GDN state {} + workspace {} = {}", format_bytes(per_rank.weights),
                     format_bytes(kv_total), format_bytes(state_total), format_bytes(per_rank.workspace),
                     format_bytes(need));
}

FitResult check_fit(const FitQuery& q) {
  validate_precision(q.precision, q.model_name);
  check(q.context > 0 && q.concurrency > 0, "{}: context and concurrency must be positive", q.model_name);
  FitResult r;
  r.per_rank = footprint(q.config, q.precision, q.tp, q.prefill_chunk, q.concurrency);
  const Footprint& f = r.per_rank;
  r.budget = q.memory * q.mem_fraction;
  r.kv_total = f.kv_per_token * double(q.context) * q.concurrency;
  r.state_total = f.state_per_sequence * q.concurrency;
  r.need = f.weights + r.kv_total + r.state_total + f.workspace;
  r.fits = r.need <= r.budget;

  const double free_for_sequences = r.budget - f.weights - f.workspace;
  const double per_sequence = f.kv_per_token * double(q.context) + f.state_per_sequence;
  r.max_concurrency = free_for_sequences > 0 ? int64_t(std::floor(free_for_sequences / per_sequence)) : 0;
  const double per_seq_budget = free_for_sequences / q.concurrency - f.state_per_sequence;
  r.max_context = per_seq_budget > 0 ? int64_t(std::floor(per_seq_budget / f.kv_per_token)) : 0;
  if (r.fits) return r;

  // Alternatives, nearest first: the same model with less load, then a smaller format, then more ranks.
  if (r.max_concurrency >= 1)
    r.would_fit.push_back(
        fmt::format("max_running_requests {} at max_model_len {}", r.max_concurrency, q.context));
  if (r.max_context >= 1024)
    r.would_fit.push_back(
        fmt::format("max_model_len {} at max_running_requests {}", r.max_context, q.concurrency));
  auto alternative = [&](FitQuery alt, const std::string& label) {
    FitResult a;
    a.per_rank = footprint(alt.config, alt.precision, alt.tp, alt.prefill_chunk, alt.concurrency);
    double need =
        a.per_rank.weights + a.per_rank.workspace +
        alt.concurrency * (a.per_rank.kv_per_token * double(alt.context) + a.per_rank.state_per_sequence);
    if (need <= alt.memory * alt.mem_fraction)
      r.would_fit.push_back(fmt::format("{} ({} per rank)", label, format_bytes(need)));
    return need <= alt.memory * alt.mem_fraction;
  };
  if (q.precision.weights == "bf16") {
    FitQuery alt = q;
    alt.precision.weights = "fp8";
    alternative(alt, "dtype fp8");
  }
  for (int tp = q.tp * 2; tp <= 8; tp *= 2) {
    FitQuery alt = q;
    alt.tp = tp;
    if (alternative(alt, fmt::format("tensor parallel over {} GPUs", tp))) break;
  }
  return r;
}

}  // namespace moeserve::deploy
