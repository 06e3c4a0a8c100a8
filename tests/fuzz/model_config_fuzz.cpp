// A checkpoint's config.json, through ModelConfig::from_file as serve and plan load it: a config that loads
// passes every check the forward pass relies on and survives to_json/from_json unchanged; anything else is a
// moeserve::Error.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "fuzz_target.h"
#include "model/config.h"

namespace moeserve::fuzz {

namespace {

// The fields the weights and the forward pass are built from (model_type, architecture and an unset dtype are
// written in their canonical form by to_json).
auto shape_of(const ModelConfig& c) {
  return std::tuple(c.is_moe, c.vocab_size, c.hidden_size, c.num_layers, c.layer_types, c.rms_norm_eps,
                    c.tie_word_embeddings, c.max_position_embeddings, c.num_heads, c.num_kv_heads, c.head_dim,
                    c.rope_theta, c.partial_rotary_factor, c.linear_num_key_heads, c.linear_num_value_heads,
                    c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel, c.num_experts,
                    c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size,
                    c.norm_topk_prob, c.intermediate_size, c.eos_token_ids, c.mtp_num_layers,
                    c.fp8.has_value(),
                    c.fp8 ? std::tuple(c.fp8->block_out, c.fp8->block_in, c.fp8->modules_to_not_convert)
                          : std::tuple(0, 0, std::vector<std::string>()));
}

// One file per process, rewritten for every input and removed at exit.
struct ScratchFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("moeserve-fuzz-config-" + std::to_string(::getpid()) + ".json"))
                         .string();
  ~ScratchFile() { std::filesystem::remove(path); }
};

}  // namespace

Verdict fuzz_model_config(std::string_view data) {
  static const ScratchFile file;
  std::ofstream(file.path, std::ios::binary | std::ios::trunc)
      .write(data.data(), std::streamsize(data.size()));
  ModelConfig c;
  try {
    c = ModelConfig::from_file(file.path);
  } catch (const Error&) {
    return Verdict::kRefused;
  }
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0, "a non-positive size");
  FUZZ_CHECK(c.layer_types.size() == size_t(c.num_layers), "{} layer types for {} layers",
             c.layer_types.size(), c.num_layers);
  FUZZ_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, "attention heads");
  FUZZ_CHECK(c.head_dim > 0 && c.rotary_dim() >= 0 && c.rotary_dim() % 2 == 0 && c.rotary_dim() <= c.head_dim,
             "rotary dimension {} of head_dim {}", c.rotary_dim(), c.head_dim);
  FUZZ_CHECK(!c.is_moe || (c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.num_experts),
             "experts per token");
  // A count read from the file sizes what loading allocates; a real model has tens of layers.
  FUZZ_CHECK(c.num_layers <= 4096, "{} layers", c.num_layers);
  (void)c.summary();
  // init-model writes configs with to_json: what it writes must load as the same model.
  FUZZ_CHECK(shape_of(ModelConfig::from_json(c.to_json())) == shape_of(c),
             "to_json/from_json changes the config");
  return Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
