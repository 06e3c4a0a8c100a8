#pragma once
// Random-weight Qwen3.5 models of the real layout: the project's demo model, full-size shapes for benchmarks,
// and `--load-format dummy`. The same config and seed give the same bytes whether the weights are written to
// a checkpoint (init_model) or built in memory (make_dummy_weights).
// Weights keep activations near unit scale: matrices ~N(0, 1/cols), embeddings ~N(0, 1), zero-centred norms
// small around 0, linear_attn.norm around 1, A_log = log(U(1, 16)), dt_bias around 1.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "model/weights.h"

namespace moeserve {

class Backend;
class TensorSet;

// tiny, small, 35b-a3b, 122b-a10b, 397b-a17b, dense-0.8b (shapes: docs/checkpoints.md). layers > 0 keeps the
// first N layers (every 4th one attention, as in the full model). An unknown name is an error listing them.
ModelConfig preset_config(const std::string& name, int layers = 0);
const std::vector<std::string>& preset_names();

struct InitModelOptions {
  uint64_t seed = 0;
  DType dtype = DType::BF16;  // BF16, or F8_E4M3 with 128x128 block scales (Qwen's modules stay BF16)
  size_t max_shard_bytes = 5'000'000'000;
  // A tokenizer.json: the vocabulary becomes its size (rounded up to a multiple of 256, as Qwen pads), the
  // eos ids its <|im_end|> and <|endoftext|>, and it is copied into the checkpoint with tokenizer_config.json
  // and chat_template.jinja when those sit beside it.
  std::string vocab_from;
  std::string chat_template;  // copied as chat_template.jinja
  // Also a vision tower of the real layout (model.visual.*, the text model under model.language_model.,
  // a nested Qwen3_5MoeForConditionalGeneration config.json with vision_config and the vision token ids):
  // the fixture's small tower for the tiny and small presets, the release's (27 blocks of 1152) otherwise.
  bool vision = false;
};

// Writes config.json, generation_config.json and the safetensors (sharded past max_shard_bytes) into dir.
// Returns the config as written.
ModelConfig init_model(ModelConfig config, const std::string& dir, const InitModelOptions& options);

// The same weights in memory, owned by the result's storage; no files.
ModelWeights make_dummy_weights(ModelConfig config, uint64_t seed, DType dtype = DType::BF16);

// Random BF16 weights made where `backend` runs when it can (a GPU: no host copy of a 70 GB model; values of
// make_random_weights, not make_dummy_weights' bytes), else make_dummy_weights'. For `--load-format dummy`
// and the engine benchmarks. fp8: every matrix but the vocabulary-sized ones (embeddings, lm_head) in
// block-scaled FP8, as the FP8 checkpoints ship them; only where the backend makes matrices (a GPU).
ModelWeights make_dummy_weights_on(Backend& backend, const ModelConfig& config, uint64_t seed,
                                   bool fp8 = false);

// Interleaved M-RoPE sections in the release's proportions, when `config` has none (a vision model needs
// them).
void add_mrope_sections(ModelConfig& config);

// A vision tower's shape (patch 16, temporal patch 2, merge 2, as in every Qwen3.5 release).
struct VisionShape {
  int depth, hidden, intermediate, heads, position_embeddings;
};
// The tower --vision writes: the tiny-moe-vl-image fixture's (2 blocks of 64) for text models narrower than
// 1024, the Qwen3.5 release's (27 blocks of 1152, 16 heads, MLP 4304, a 48x48 position table) otherwise.
VisionShape default_vision_shape(const ModelConfig& config);

// The config.json root a --vision checkpoint of this shape has (vision_config with out_hidden_size the text
// model's hidden size, and the vision token ids: taken by name from `token_ids` when given, else Qwen3.5's
// for its vocabulary or the vocabulary's last ids). vision/tower.h's VisionConfig::from_json reads it.
nlohmann::json dummy_vision_config(const ModelConfig& config, const std::map<std::string, int64_t>& token_ids,
                                   const VisionShape& shape);

// That tower in memory (the demo model's, --load-format dummy's): the model.visual.* tensors (BF16) and
// dummy_vision_config. vision/tower.h's load_vision_weights reads the tensors.
struct DummyVision {
  std::shared_ptr<const TensorSet> tensors;
  nlohmann::json config;
};
DummyVision make_dummy_vision(const ModelConfig& config, uint64_t seed,
                              const std::map<std::string, int64_t>& token_ids, const VisionShape& shape);

}  // namespace moeserve
