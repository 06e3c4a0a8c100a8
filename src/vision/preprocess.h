#pragma once
// Qwen's image processor (transformers' Qwen2VLImageProcessor, the torchvision backend Qwen3.5 loads):
// smart_resize to multiples of patch × merge within [min_pixels, max_pixels], a bicubic antialiased resize of
// the 8-bit image as torch computes it, normalisation, the temporal patch (the image repeated), and the
// patches in merge-block order. docs/vision.md gives each convention and where it comes from.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "vision/image.h"

namespace moeserve {

struct ImageProcessorConfig {
  int patch_size = 16;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 65'536;      // size.shortest_edge (the name notwithstanding, a pixel count)
  int64_t max_pixels = 16'777'216;  // size.longest_edge
  double rescale_factor = 1.0 / 255;
  double mean[3] = {0.5, 0.5, 0.5};
  double std[3] = {0.5, 0.5, 0.5};

  int factor() const { return patch_size * merge_size; }
  // preprocessor_config.json's fields (missing ones keep the Qwen3.5 release values above). Throws Error.
  static ImageProcessorConfig from_json(const nlohmann::json& j);
  // DIR/preprocessor_config.json, or the defaults where the checkpoint has none.
  static ImageProcessorConfig from_dir(const std::string& dir);
};

// The processor's target (height, width): multiples of `factor`, the pixel count within [min, max], the
// aspect ratio kept. Python's round (half to even) as smart_resize uses it. Throws ImageError for an aspect
// ratio over 200, as the processor does.
std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// Planar 8-bit RGB [3][height][width], as the processor holds an image.
struct PlanarImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> planes;
};

// torch's F.interpolate(mode="bicubic", antialias=True, align_corners=False) of a uint8 image: separable
// (width first, then height, each pass rounded to uint8), Keys' cubic (a = -0.5) stretched by the scale
// when shrinking, weights quantised to int16 at the precision the largest weight allows.
PlanarImage resize_bicubic(const Image& image, int height, int width);

// One image ready for the vision tower.
struct ImagePatches {
  int grid_t = 1, grid_h = 0, grid_w = 0;  // in patches (image_grid_thw)
  // [grid_t·grid_h·grid_w][3·temporal·patch·patch]: rows in merge-block order (t, h/merge, w/merge, merge,
  // merge), columns (channel, t, y, x); (x - mean/rescale)/(std/rescale) in float32, as the torchvision
  // backend fuses rescaling into normalisation.
  std::vector<float> pixel_values;
  int64_t patches() const { return int64_t(grid_t) * grid_h * grid_w; }
  // Language-model tokens the image becomes after the merger.
  int64_t tokens(int merge_size) const { return patches() / (int64_t(merge_size) * merge_size); }
};

ImagePatches patchify(const PlanarImage& resized, const ImageProcessorConfig& config);
ImagePatches preprocess_image(const Image& image, const ImageProcessorConfig& config);

}  // namespace moeserve
