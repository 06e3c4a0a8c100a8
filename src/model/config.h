#pragma once
// ModelConfig: the hyper-parameters of a Qwen3.5 text model, read from a Hugging Face config.json.
// Flat text configs (model_type qwen3_5_moe_text / qwen3_5_text) and nested multimodal ones (qwen3_5_moe /
// qwen3_5 with text_config) give the same struct. Field meanings: docs/qwen35-model.md §1.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moeserve {

enum class LayerType : uint8_t { LinearAttention, FullAttention };

struct Fp8Quantization {
  int block_out = 128;  // weight_block_size[0]: rows per scale block
  int block_in = 128;   // weight_block_size[1]: columns per scale block
  std::vector<std::string> modules_to_not_convert;  // substrings of tensor names kept in high precision
};

struct ModelConfig {
  std::string model_type;    // as written at the top level (qwen3_5_moe, qwen3_5_moe_text, ...)
  std::string architecture;  // architectures[0], informational
  bool is_moe = true;
  std::string dtype;  // "dtype" (or "torch_dtype") as saved: bfloat16, float16, float32

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_layers = 0;
  std::vector<LayerType> layer_types;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;

  // Gated attention.
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  int rotary_dim() const { return int(head_dim * partial_rotary_factor); }
  // Round RoPE's inverse frequencies to bf16, as HF does when a model's buffers were cast to bf16 and back
  // (the fixtures' references were made that way). Serving keeps float32, as vLLM/SGLang do: bf16
  // frequencies drift by whole turns at long context.
  bool rope_bf16_inv_freq = false;
  // inv_freq[i] = theta^(-2i/rotary_dim), i < rotary_dim/2, in float32.
  std::vector<float> rope_inv_freq() const;
  // M-RoPE (rope_parameters.mrope_section, interleaved): frequency i rotates by the height position when
  // i % 3 == 1 and i < 3·section[1], by the width position when i % 3 == 2 and i < 3·section[2], else by the
  // temporal one. Empty: every frequency takes the temporal position. docs/vision.md.
  std::vector<int> mrope_section;
  // Per frequency: 0 (temporal), 1 (height) or 2 (width).
  std::vector<uint8_t> mrope_axes() const;

  // Gated DeltaNet.
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel = 4;
  int64_t linear_key_dim() const { return int64_t(linear_num_key_heads) * linear_key_head_dim; }
  int64_t linear_value_dim() const { return int64_t(linear_num_value_heads) * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }

  // Feed-forward: MoE (is_moe) or a dense SwiGLU MLP.
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool norm_topk_prob = true;
  int64_t intermediate_size = 0;  // dense models

  std::vector<int64_t> eos_token_ids;  // from config.json / generation_config.json when present
  int mtp_num_layers = 0;
  std::optional<Fp8Quantization> fp8;

  int count_layers(LayerType t) const;

  // Throws moeserve::Error with the field at fault; an unknown model_type names the supported ones.
  static ModelConfig from_json(const nlohmann::json& root);
  static ModelConfig from_file(const std::string& path);  // config.json
  nlohmann::json to_json() const;  // a flat qwen3_5_moe_text / qwen3_5_text config.json

  // Human-readable one-liner: "qwen3_5_moe 40 layers (30 GDN + 10 attention), hidden 2048, 256 experts top-8".
  std::string summary() const;
};

}  // namespace moeserve
