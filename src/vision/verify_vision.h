#pragma once
// `moeserve verify` for a vision reference (tests/fixtures/models/tiny-moe-vl-image): every stage of the
// image path against Hugging Face, one line each — decoded and resized pixels, pixel_values and grid, the
// tower's stages and merged features, the M-RoPE positions, the embeddings after placement, the logits of
// every position (whole and in chunks that split an image's tokens), and greedy decoding with the image in
// context.

#include <string>
#include <vector>

#include "model/qwen35.h"
#include "vision/tower.h"

namespace moeserve {

class TensorSet;

struct VisionCheck {
  std::string name;  // "image0 resized", "prompt1 logits (chunks of 16)", "gen0 tokens", ...
  double max_abs_error = 0;
  double tolerance = 0;
  bool ok = false;
};

struct VisionVerifyReport {
  std::vector<VisionCheck> checks;
  bool passed = false;
};

// Whether a reference holds the vision cases (image0.pixel_values).
bool is_vision_reference(const TensorSet& reference);

// dir holds the images and reference.json (which prompt shows which images) next to the reference. Float
// stages must agree within `tolerance`, absolute, or with `relative` times max(1, the stage's largest
// reference magnitude) (bf16 tensor cores, whose roundings are relative: docs/cuda.md); pixels, grids,
// positions and greedy tokens exactly.
VisionVerifyReport verify_vision_reference(const Qwen35Model& model, const VisionWeights& vision,
                                           const ImageProcessorConfig& processor, const std::string& dir,
                                           const TensorSet& reference, double tolerance, int64_t chunk,
                                           bool relative = false);

}  // namespace moeserve
