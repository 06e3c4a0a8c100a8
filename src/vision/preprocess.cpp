#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/bounded_json.h"

namespace moeserve {
namespace {

// One output position of a 1-D resampling pass: the first input index, and int16 weights over the inputs.
struct Taps {
  int64_t first = 0;
  std::vector<int16_t> weights;
};

struct Pass {
  std::vector<Taps> taps;  // per output index
  int precision = 0;       // weights are fixed-point with this many fraction bits
};

// Keys' cubic convolution kernel with a = -0.5 (PIL's and torch's antialiased bicubic).
double keys_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// The weights as torch computes them for uint8 input (UpSampleKernel.cpp:
// _compute_indices_min_size_weights_aa in double, then _compute_index_ranges_int16_weights), so that every
// rounding agrees.
Pass make_pass(int64_t in, int64_t out) {
  double scale = double(in) / double(out);
  double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  int64_t max_taps = int64_t(std::ceil(support)) * 2 + 1;
  double inv_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  std::vector<std::vector<double>> weights(static_cast<size_t>(out));
  std::vector<int64_t> first(static_cast<size_t>(out));
  double max_weight = 0.0;
  for (int64_t i = 0; i < out; ++i) {
    double center = scale * (double(i) + 0.5);
    int64_t lo = std::max(int64_t(center - support + 0.5), int64_t(0));
    int64_t n = std::clamp(std::min(int64_t(center + support + 0.5), in) - lo, int64_t(0), max_taps);
    std::vector<double>& w = weights[size_t(i)];
    w.resize(size_t(n));
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j)
      total += w[size_t(j)] = keys_cubic((double(j + lo) - center + 0.5) * inv_scale);
    if (total != 0.0)
      for (double& v : w) max_weight = std::max(max_weight, v /= total);
    first[size_t(i)] = lo;
  }
  Pass pass;
  // The most fraction bits that keep the largest weight below 2^15.
  while (pass.precision < 22 && int(0.5 + max_weight * double(1 << (pass.precision + 1))) < (1 << 15))
    ++pass.precision;
  pass.taps.resize(size_t(out));
  for (int64_t i = 0; i < out; ++i) {
    Taps& t = pass.taps[size_t(i)];
    t.first = first[size_t(i)];
    for (double w : weights[size_t(i)]) {
      double v = w * double(1 << pass.precision);
      t.weights.push_back(int16_t(v < 0 ? int(-0.5 + v) : int(0.5 + v)));
    }
  }
  return pass;
}

// dst[line][o] = round(Σ src[line][first + j]·w_j): `lines` lines, element k of a line at offset k·step,
// line l at l·line_step (the same strides in and out).
void run_pass(const Pass& pass, const uint8_t* src, int64_t src_step, int64_t src_line_step, uint8_t* dst,
              int64_t dst_step, int64_t dst_line_step, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l) {
    const uint8_t* s = src + l * src_line_step;
    uint8_t* d = dst + l * dst_line_step;
    for (size_t o = 0; o < pass.taps.size(); ++o) {
      const Taps& t = pass.taps[o];
      int32_t acc = 1 << (pass.precision - 1);
      for (size_t j = 0; j < t.weights.size(); ++j)
        acc += int32_t(s[(t.first + int64_t(j)) * src_step]) * t.weights[j];
      d[int64_t(o) * dst_step] = uint8_t(std::clamp(acc >> pass.precision, 0, 255));
    }
  }
}

}  // namespace

ImageProcessorConfig ImageProcessorConfig::from_json(const nlohmann::json& j) {
  ImageProcessorConfig c;
  auto integer = [&](const nlohmann::json& v, const char* name, int64_t lo, int64_t hi) {
    check(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
          "preprocessor_config.json: {} must be an integer in [{}, {}]", name, lo, hi);
    return v.get<int64_t>();
  };
  if (j.contains("patch_size")) c.patch_size = int(integer(j["patch_size"], "patch_size", 1, 1024));
  if (j.contains("temporal_patch_size"))
    c.temporal_patch_size = int(integer(j["temporal_patch_size"], "temporal_patch_size", 1, 16));
  if (j.contains("merge_size")) c.merge_size = int(integer(j["merge_size"], "merge_size", 1, 16));
  constexpr int64_t kMaxPixels = int64_t(1) << 40;
  if (j.contains("size") && j["size"].is_object()) {
    const auto& size = j["size"];
    if (size.contains("shortest_edge"))
      c.min_pixels = integer(size["shortest_edge"], "size.shortest_edge", 1, kMaxPixels);
    if (size.contains("longest_edge"))
      c.max_pixels = integer(size["longest_edge"], "size.longest_edge", 1, kMaxPixels);
  }
  if (j.contains("min_pixels")) c.min_pixels = integer(j["min_pixels"], "min_pixels", 1, kMaxPixels);
  if (j.contains("max_pixels")) c.max_pixels = integer(j["max_pixels"], "max_pixels", 1, kMaxPixels);
  check(c.min_pixels <= c.max_pixels, "preprocessor_config.json: min pixels {} above max pixels {}",
        c.min_pixels, c.max_pixels);
  if (j.contains("rescale_factor")) {
    check(j["rescale_factor"].is_number() && j["rescale_factor"].get<double>() > 0,
          "preprocessor_config.json: rescale_factor must be a positive number");
    c.rescale_factor = j["rescale_factor"].get<double>();
  }
  for (const char* key : {"image_mean", "image_std"}) {
    if (!j.contains(key)) continue;
    const auto& v = j[key];
    check(v.is_array() && v.size() == 3 &&
              std::all_of(v.begin(), v.end(), [](auto& x) { return x.is_number(); }),
          "preprocessor_config.json: {} must be three numbers", key);
    double* dst = std::string_view(key) == "image_mean" ? c.mean : c.std;
    for (int i = 0; i < 3; ++i) dst[i] = v[size_t(i)].get<double>();
  }
  for (double s : c.std) check(s > 0, "preprocessor_config.json: image_std must be positive");
  return c;
}

ImageProcessorConfig ImageProcessorConfig::from_dir(const std::string& dir) {
  auto path = std::filesystem::path(dir) / "preprocessor_config.json";
  if (!std::filesystem::exists(path)) return {};
  std::ifstream in(path);
  check(in.good(), "cannot read {}", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return from_json(parse_bounded_json<nlohmann::json>(text.str()));
}

std::pair<int, int> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0) throw ImageError("the image has no pixels");
  double h = height, w = width, f = factor;
  if (std::max(h, w) / std::min(h, w) > 200)
    throw ImageError(fmt::format("the image's aspect ratio must be at most 200, got {}x{}", width, height));
  // std::nearbyint rounds half to even in the default rounding mode, as Python's round does.
  double h_bar = std::nearbyint(h / f) * f, w_bar = std::nearbyint(w / f) * f;
  if (h_bar * w_bar > double(max_pixels)) {
    double beta = std::sqrt(h * w / double(max_pixels));
    h_bar = std::max(f, std::floor(h / beta / f) * f);
    w_bar = std::max(f, std::floor(w / beta / f) * f);
  } else if (h_bar * w_bar < double(min_pixels)) {
    double beta = std::sqrt(double(min_pixels) / (h * w));
    h_bar = std::ceil(h * beta / f) * f;
    w_bar = std::ceil(w * beta / f) * f;
  }
  return {int(h_bar), int(w_bar)};
}

PlanarImage resize_bicubic(const Image& image, int height, int width) {
  const int64_t in_w = image.width, in_h = image.height, plane_in = in_w * in_h;
  // Planar copy of the input: the passes below run on one channel at a time.
  std::vector<uint8_t> src(size_t(plane_in) * 3);
  for (int64_t i = 0; i < plane_in; ++i)
    for (int c = 0; c < 3; ++c) src[size_t(c * plane_in + i)] = image.rgb[size_t(i * 3 + c)];
  std::vector<uint8_t> mid = src;
  int64_t mid_w = in_w;
  if (width != in_w) {
    Pass horizontal = make_pass(in_w, width);
    mid.assign(size_t(3 * in_h * width), 0);
    run_pass(horizontal, src.data(), 1, in_w, mid.data(), 1, width, 3 * in_h);
    mid_w = width;
  }
  PlanarImage out;
  out.width = width, out.height = height;
  if (height == in_h) {
    out.planes = std::move(mid);
    return out;
  }
  Pass vertical = make_pass(in_h, height);
  out.planes.assign(size_t(3) * size_t(height) * size_t(width), 0);
  for (int c = 0; c < 3; ++c)
    run_pass(vertical, mid.data() + c * in_h * mid_w, mid_w, 1,
             out.planes.data() + int64_t(c) * height * width, width, 1, width);
  return out;
}

ImagePatches patchify(const PlanarImage& img, const ImageProcessorConfig& c) {
  const int p = c.patch_size, m = c.merge_size, t = c.temporal_patch_size;
  check(img.height % (p * m) == 0 && img.width % (p * m) == 0, "patchify: {}x{} is not a multiple of {}",
        img.width, img.height, p * m);
  ImagePatches out;
  out.grid_t = 1;  // one image: its temporal_patch_size copies make one temporal patch
  out.grid_h = img.height / p, out.grid_w = img.width / p;
  const int64_t cols = int64_t(3) * t * p * p, plane = int64_t(img.height) * img.width;
  out.pixel_values.resize(size_t(out.patches() * cols));
  float mean[3], std[3];
  for (int ch = 0; ch < 3; ++ch) {
    mean[ch] = float(c.mean[ch] * (1.0 / c.rescale_factor));
    std[ch] = float(c.std[ch] * (1.0 / c.rescale_factor));
  }
  int64_t row = 0;
  for (int bh = 0; bh < out.grid_h / m; ++bh)
    for (int bw = 0; bw < out.grid_w / m; ++bw)
      for (int mh = 0; mh < m; ++mh)
        for (int mw = 0; mw < m; ++mw, ++row) {
          int y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
          float* dst = &out.pixel_values[size_t(row * cols)];
          for (int ch = 0; ch < 3; ++ch)
            for (int ti = 0; ti < t; ++ti)
              for (int y = 0; y < p; ++y)
                for (int x = 0; x < p; ++x)
                  *dst++ = (float(img.planes[size_t(ch * plane + int64_t(y0 + y) * img.width + x0 + x)]) -
                            mean[ch]) /
                           std[ch];
        }
  return out;
}

ImagePatches preprocess_image(const Image& image, const ImageProcessorConfig& config) {
  auto [h, w] =
      smart_resize(image.height, image.width, config.factor(), config.min_pixels, config.max_pixels);
  return patchify(resize_bicubic(image, h, w), config);
}

}  // namespace moeserve
