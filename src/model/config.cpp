#include "model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/dtype.h"
#include "common/error.h"

namespace moeserve {
namespace {

// Far above any real model (Qwen3.5-397B has 60 layers), far below what would exhaust memory.
constexpr int kMaxLayers = 4096;

using nlohmann::json;

constexpr const char* kSupported = "qwen3_5_moe, qwen3_5_moe_text, qwen3_5, qwen3_5_text";

// A field's value as T. Integers must fit T: nlohmann converts 1e300 or 2^40 to int without a check (undefined
// behaviour, found by the fuzzer), so the range is checked here first; an integral float (4.0) is accepted.
template <typename T>
T converted(const json& v, const char* key) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    check(v.is_number(), "config.json: field '{}' must be an integer, got {}", key, v.type_name());
    if (v.is_number_float()) {
      const double d = v.get<double>();
      check(std::isfinite(d) && d == std::floor(d) && d >= double(std::numeric_limits<T>::min()) &&
                d <= double(std::numeric_limits<T>::max()),
            "config.json: field '{}' must be an integer in range, got {}", key, d);
      return static_cast<T>(d);
    }
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                          : v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                (std::is_unsigned_v<T> ? v.get<int64_t>() >= 0
                                                       : v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max()));
    check(fits, "config.json: field '{}' is out of range ({})", key, v.dump());
    return v.get<T>();
  } else {
    try {
      return v.get<T>();
    } catch (const json::exception&) {
      fail("config.json: field '{}' has the wrong type ({})", key, v.type_name());
    }
  }
}

// Reads a required field, with the field name in the error.
template <typename T>
T required(const json& j, const char* key) {
  auto it = j.find(key);
  check(it != j.end() && !it->is_null(), "config.json: missing required field '{}'", key);
  return converted<T>(*it, key);
}

template <typename T>
T optional_field(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return converted<T>(*it, key);
}

std::vector<int64_t> token_ids(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (it->is_number_integer()) return {it->get<int64_t>()};
  check(it->is_array(), "config.json: field '{}' must be an integer or a list of integers", key);
  std::vector<int64_t> ids;
  for (const auto& v : *it) {
    check(v.is_number_integer(), "config.json: field '{}' must hold integers", key);
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

}  // namespace

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int rot = rotary_dim();
  std::vector<float> inv_freq(static_cast<size_t>(rot / 2));
  for (int i = 0; i < rot / 2; ++i) {
    // HF: 1 / theta ** (arange(0, rot, 2).float() / rot), all in float32
    float f = 1.0f / std::pow(float(rope_theta), float(2 * i) / float(rot));
    inv_freq[size_t(i)] = rope_bf16_inv_freq ? bf16_to_f32(f32_to_bf16(f)) : f;
  }
  return inv_freq;
}

std::vector<uint8_t> ModelConfig::mrope_axes() const {
  std::vector<uint8_t> axes(size_t(rotary_dim() / 2), 0);
  if (mrope_section.size() != 3) return axes;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (i % 3 == 1 && i < size_t(3 * mrope_section[1])) axes[i] = 1;
    if (i % 3 == 2 && i < size_t(3 * mrope_section[2])) axes[i] = 2;
  }
  return axes;
}

int ModelConfig::count_layers(LayerType t) const {
  return int(std::count(layer_types.begin(), layer_types.end(), t));
}

ModelConfig ModelConfig::from_json(const json& root) {
  check(root.is_object(), "config.json: the top level must be a JSON object");
  ModelConfig c;
  c.model_type = optional_field<std::string>(root, "model_type", "");
  if (auto a = root.find("architectures"); a != root.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    c.architecture = (*a)[0].get<std::string>();

  const json* text = &root;
  if (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5") {
    auto it = root.find("text_config");
    check(it != root.end() && it->is_object(), "config.json: model_type '{}' needs a 'text_config' object",
          c.model_type);
    text = &*it;
  } else if (c.model_type != "qwen3_5_moe_text" && c.model_type != "qwen3_5_text") {
    fail("config.json: unsupported model_type '{}' (supported: {})", c.model_type, kSupported);
  }
  const json& t = *text;
  c.dtype = optional_field<std::string>(root, "dtype", optional_field<std::string>(root, "torch_dtype", ""));
  if (c.dtype.empty()) c.dtype = optional_field<std::string>(t, "dtype", optional_field<std::string>(t, "torch_dtype", ""));
  c.is_moe = c.model_type.starts_with("qwen3_5_moe");

  c.vocab_size = required<int64_t>(t, "vocab_size");
  c.hidden_size = required<int64_t>(t, "hidden_size");
  c.num_layers = required<int>(t, "num_hidden_layers");
  // Checked before layer_types is built from it: 10^8 layers would first allocate that many entries.
  check(c.num_layers > 0 && c.num_layers <= kMaxLayers, "config.json: num_hidden_layers must be in 1..{}, got {}",
        kMaxLayers, c.num_layers);
  c.rms_norm_eps = optional_field<double>(t, "rms_norm_eps", 1e-6);
  // Multimodal configs keep tie_word_embeddings at the top level; text configs inside.
  c.tie_word_embeddings =
      optional_field<bool>(t, "tie_word_embeddings", optional_field<bool>(root, "tie_word_embeddings", false));
  c.max_position_embeddings = optional_field<int64_t>(t, "max_position_embeddings", 262144);

  c.num_heads = required<int>(t, "num_attention_heads");
  c.num_kv_heads = required<int>(t, "num_key_value_heads");
  c.head_dim = optional_field<int>(t, "head_dim", c.num_heads > 0 ? int(c.hidden_size / c.num_heads) : 0);

  // rope_parameters (transformers v5) with fallbacks to the v4 top-level fields.
  c.rope_theta = optional_field<double>(t, "rope_theta", 1e7);
  c.partial_rotary_factor = optional_field<double>(t, "partial_rotary_factor", 0.25);
  if (auto rp = t.find("rope_parameters"); rp != t.end() && rp->is_object()) {
    c.rope_theta = optional_field<double>(*rp, "rope_theta", c.rope_theta);
    c.partial_rotary_factor = optional_field<double>(*rp, "partial_rotary_factor", c.partial_rotary_factor);
    auto type = optional_field<std::string>(*rp, "rope_type", "default");
    check(type == "default", "config.json: rope_type '{}' is not supported (only 'default')", type);
    if (auto ms = rp->find("mrope_section"); ms != rp->end() && !ms->is_null()) {
      check(ms->is_array() && ms->size() == 3,
            "config.json: rope_parameters.mrope_section must be three integers");
      for (const auto& v : *ms) {
        check(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 4096,
              "config.json: rope_parameters.mrope_section must be three integers in [0, 4096]");
        c.mrope_section.push_back(int(v.get<int64_t>()));
      }
    }
  }

  c.linear_num_key_heads = required<int>(t, "linear_num_key_heads");
  c.linear_num_value_heads = required<int>(t, "linear_num_value_heads");
  c.linear_key_head_dim = required<int>(t, "linear_key_head_dim");
  c.linear_value_head_dim = required<int>(t, "linear_value_head_dim");
  c.linear_conv_kernel = optional_field<int>(t, "linear_conv_kernel_dim", 4);

  if (c.is_moe) {
    c.num_experts = required<int>(t, "num_experts");
    c.num_experts_per_tok = required<int>(t, "num_experts_per_tok");
    c.moe_intermediate_size = required<int64_t>(t, "moe_intermediate_size");
    c.shared_expert_intermediate_size = optional_field<int64_t>(t, "shared_expert_intermediate_size", 0);
    c.norm_topk_prob = optional_field<bool>(t, "norm_topk_prob", true);
  } else {
    c.intermediate_size = required<int64_t>(t, "intermediate_size");
  }

  // layer_types, or the full_attention_interval rule: layer i is attention iff (i+1) % interval == 0.
  if (auto lt = t.find("layer_types"); lt != t.end() && !lt->is_null()) {
    check(lt->is_array(), "config.json: 'layer_types' must be a list");
    for (const auto& v : *lt) {
      auto s = v.is_string() ? v.get<std::string>() : std::string();
      if (s == "linear_attention") {
        c.layer_types.push_back(LayerType::LinearAttention);
      } else if (s == "full_attention") {
        c.layer_types.push_back(LayerType::FullAttention);
      } else {
        fail("config.json: unknown layer type '{}' in 'layer_types' (expected linear_attention or full_attention)",
             v.dump());
      }
    }
  } else {
    int interval = optional_field<int>(t, "full_attention_interval", 4);
    check(interval > 0, "config.json: 'full_attention_interval' must be positive");
    for (int i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  }
  check(int(c.layer_types.size()) == c.num_layers,
        "config.json: 'layer_types' has {} entries but num_hidden_layers is {}", c.layer_types.size(), c.num_layers);

  c.eos_token_ids = token_ids(t, "eos_token_id");
  if (c.eos_token_ids.empty()) c.eos_token_ids = token_ids(root, "eos_token_id");
  c.mtp_num_layers = optional_field<int>(t, "mtp_num_hidden_layers", 0);

  // quantization_config sits at the top level (also for nested configs).
  const json* q = nullptr;
  if (auto it = root.find("quantization_config"); it != root.end() && it->is_object()) q = &*it;
  else if (auto it2 = t.find("quantization_config"); it2 != t.end() && it2->is_object()) q = &*it2;
  if (q) {
    auto method = optional_field<std::string>(*q, "quant_method", "");
    check(method == "fp8", "config.json: quant_method '{}' is not supported (only 'fp8')", method);
    auto fmt_name = optional_field<std::string>(*q, "fmt", "e4m3");
    check(fmt_name == "e4m3", "config.json: fp8 format '{}' is not supported (only 'e4m3')", fmt_name);
    Fp8Quantization fp8;
    if (auto bs = q->find("weight_block_size"); bs != q->end() && !bs->is_null()) {
      check(bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer() && (*bs)[1].is_number_integer(),
            "config.json: 'weight_block_size' must be [rows, cols]");
      fp8.block_out = converted<int>((*bs)[0], "weight_block_size");
      fp8.block_in = converted<int>((*bs)[1], "weight_block_size");
      check(fp8.block_out > 0 && fp8.block_in > 0, "config.json: 'weight_block_size' must be positive");
    }
    fp8.modules_to_not_convert = optional_field<std::vector<std::string>>(*q, "modules_to_not_convert", {});
    c.fp8 = fp8;
  }

  // Shape sanity: every later divide and index relies on these.
  check(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0, "config.json: sizes must be positive");
  check(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
        "config.json: num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
        c.num_heads, c.num_kv_heads);
  // The factor first: int(head_dim * factor) of a huge or negative factor is out of int's range or negative.
  check(std::isfinite(c.partial_rotary_factor) && c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1,
        "config.json: partial_rotary_factor must be in (0, 1], got {}", c.partial_rotary_factor);
  check(c.head_dim > 0 && c.rotary_dim() > 0 && c.rotary_dim() % 2 == 0 && c.rotary_dim() <= c.head_dim,
        "config.json: head_dim {} with partial_rotary_factor {} gives an invalid rotary dimension", c.head_dim,
        c.partial_rotary_factor);
  check(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
        "config.json: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
        c.linear_num_value_heads, c.linear_num_key_heads);
  check(c.linear_key_head_dim > 0 && c.linear_value_head_dim > 0 && c.linear_conv_kernel > 0,
        "config.json: linear head dims and conv kernel must be positive");
  if (c.is_moe)
    check(c.num_experts > 0 && c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts &&
              c.moe_intermediate_size > 0,
          "config.json: num_experts_per_tok ({}) must be in 1..num_experts ({})", c.num_experts_per_tok,
          c.num_experts);
  else
    check(c.intermediate_size > 0, "config.json: intermediate_size must be positive");
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot open {}", path);
  json root;
  try {
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    root = parse_bounded_json<json>(text);
  } catch (const JsonParseError& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
  try {
    return from_json(root);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

json ModelConfig::to_json() const {
  json j;
  j["architectures"] = {is_moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"};
  j["model_type"] = is_moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_layers;
  std::vector<std::string> types;
  for (auto lt : layer_types) types.push_back(lt == LayerType::FullAttention ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta},
                          {"partial_rotary_factor", partial_rotary_factor}};
  if (!mrope_section.empty()) {
    j["rope_parameters"]["mrope_section"] = mrope_section;
    j["rope_parameters"]["mrope_interleaved"] = true;
  }
  j["linear_num_key_heads"] = linear_num_key_heads;
  j["linear_num_value_heads"] = linear_num_value_heads;
  j["linear_key_head_dim"] = linear_key_head_dim;
  j["linear_value_head_dim"] = linear_value_head_dim;
  j["linear_conv_kernel_dim"] = linear_conv_kernel;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (is_moe) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
  } else {
    j["intermediate_size"] = intermediate_size;
  }
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  if (mtp_num_layers) j["mtp_num_hidden_layers"] = mtp_num_layers;
  if (fp8) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {fp8->block_out, fp8->block_in}},
                                {"modules_to_not_convert", fp8->modules_to_not_convert}};
  }
  j["dtype"] = dtype.empty() ? "bfloat16" : dtype;
  return j;
}

std::string ModelConfig::summary() const {
  std::string ffn = is_moe ? fmt::format("{} experts top-{}{}", num_experts, num_experts_per_tok,
                                         shared_expert_intermediate_size ? " + shared" : "")
                           : fmt::format("dense MLP {}", intermediate_size);
  return fmt::format("{} {} layers ({} GDN + {} attention), hidden {}, {}, vocab {}{}", model_type, num_layers,
                     count_layers(LayerType::LinearAttention), count_layers(LayerType::FullAttention), hidden_size,
                     ffn, vocab_size, fp8 ? ", fp8 weights" : "");
}

}  // namespace moeserve
