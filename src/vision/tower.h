#pragma once
// The Qwen3.5 vision tower (HF Qwen3_5MoeVisionModel) over the Backend: patch embedding (the Conv3d as a
// matmul over pixel_values rows), the learned position table resampled bilinearly to each image's grid, 2D
// rotary on the whole head, pre-norm ViT blocks with bidirectional attention within one image, and the
// patch merger (a merge block's rows concatenated, then an MLP). One call encodes a batch of images.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/matrix.h"
#include "vision/preprocess.h"

namespace moeserve {

class TensorSet;

struct VisionConfig {
  int depth = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_heads = 0;
  int out_hidden_size = 0;          // the language model's hidden size
  int num_position_embeddings = 0;  // a side × side table
  int patch_size = 16;
  int temporal_patch_size = 2;
  int spatial_merge_size = 2;
  bool gelu_tanh = true;  // hidden_act gelu_pytorch_tanh (the blocks; the merger's GELU is exact)
  double rope_theta = 10000.0;
  float layer_norm_eps = 1e-6f;
  // The language model's vision tokens (top level of config.json).
  int32_t image_token_id = -1;
  int32_t vision_start_token_id = -1;
  int32_t vision_end_token_id = -1;

  int head_dim() const { return hidden_size / num_heads; }
  int position_side() const;
  int64_t patch_columns() const { return int64_t(3) * temporal_patch_size * patch_size * patch_size; }
  // config.json's vision_config; nullopt when the checkpoint has none. Throws Error on bad values.
  static std::optional<VisionConfig> from_json(const nlohmann::json& config);
  static std::optional<VisionConfig> from_dir(const std::string& dir);
};

struct VisionBlockWeights {
  std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b;
  Matrix qkv, proj, fc1, fc2;
  std::vector<float> qkv_b, proj_b, fc1_b, fc2_b;
};

struct VisionWeights {
  VisionConfig config;
  Matrix patch_embed;  // [hidden][3·temporal·patch·patch], the Conv3d kernel flattened (c, t, y, x)
  std::vector<float> patch_embed_b;
  std::vector<float> pos_embed;  // [side·side][hidden]
  std::vector<VisionBlockWeights> blocks;
  std::vector<float> merger_norm_w, merger_norm_b;
  Matrix merger_fc1, merger_fc2;
  std::vector<float> merger_fc1_b, merger_fc2_b;
  std::vector<std::shared_ptr<void>> storage;  // keeps the views' bytes alive
};

// model.visual.* of a checkpoint. Throws Error listing every missing or mis-shaped tensor.
VisionWeights load_vision_weights(std::shared_ptr<const TensorSet> tensors, const VisionConfig& config);

// Stage outputs of one encode, on the host, for tests and `verify`.
struct VisionTrace {
  std::vector<float> patch_embed;             // [patches][hidden]
  std::vector<float> block_input;             // patch_embed + resampled positions
  std::vector<std::vector<float>> blocks;     // each block's output
  std::vector<float> rotary_cos, rotary_sin;  // [patches][head_dim / 2]
};

class VisionTower {
 public:
  VisionTower(const VisionWeights& weights, Backend& backend);

  // The merged features of each image, concatenated in order: [Σ tokens][out_hidden_size] (host memory).
  std::vector<float> encode(std::span<const ImagePatches* const> images, VisionTrace* trace = nullptr);

  const VisionConfig& config() const { return w_.config; }

 private:
  const VisionWeights& w_;
  Backend& b_;
};

// The resampled position table of one image in merge-block row order: [patches][hidden].
std::vector<float> resampled_positions(const VisionWeights& w, int grid_h, int grid_w);
// The 2D rotary angles' cos and sin of one image in merge-block order: [patches][head_dim / 2] each.
void vision_rotary(const VisionConfig& c, int grid_h, int grid_w, std::vector<float>& cos,
                   std::vector<float>& sin);

}  // namespace moeserve
