#include "vision/tower.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/bounded_json.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "model/safetensors.h"

namespace moeserve {
namespace {

int positive_int(const nlohmann::json& j, const char* key, int fallback, int max) {
  if (!j.contains(key)) {
    check(fallback > 0, "config.json: vision_config.{} is missing", key);
    return fallback;
  }
  const auto& v = j[key];
  check(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= max,
        "config.json: vision_config.{} must be an integer in [1, {}]", key, max);
  return int(v.get<int64_t>());
}

int32_t token_id(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return -1;
  check(
      j[key].is_number_integer() && j[key].get<int64_t>() >= 0 && j[key].get<int64_t>() < (int64_t(1) << 31),
      "config.json: {} must be a token id", key);
  return int32_t(j[key].get<int64_t>());
}

// Collects every problem before failing, as the text checkpoint's loader does.
class Loader {
 public:
  Loader(const TensorSet& tensors, VisionWeights& w) : tensors_(tensors), w_(w) {}
  std::vector<std::string> problems;

  const TensorInfo* find(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = tensors_.find("model.visual." + name);
    if (t == nullptr) {
      problems.push_back(fmt::format("missing model.visual.{}", name));
      return nullptr;
    }
    if (t->shape != shape) {
      problems.push_back(fmt::format("model.visual.{} is {}, expected {} elements in {} axes", name,
                                     t->describe(), numel(shape), shape.size()));
      return nullptr;
    }
    if (t->dtype != DType::BF16 && t->dtype != DType::F16 && t->dtype != DType::F32) {
      problems.push_back(
          fmt::format("model.visual.{} is {}, expected BF16, F16 or F32", name, t->describe()));
      return nullptr;
    }
    return t;
  }

  // A view of the stored matrix (copied once where the bytes are misaligned for their dtype).
  Matrix matrix(const std::string& name, const std::vector<int64_t>& shape, int64_t rows, int64_t cols) {
    const TensorInfo* t = find(name, shape);
    if (t == nullptr) return {};
    const void* data = t->data;
    if (reinterpret_cast<uintptr_t>(data) % dtype_size(t->dtype) != 0) {
      auto copy = std::make_shared<std::vector<uint8_t>>(t->data, t->data + t->nbytes);
      w_.storage.push_back(copy);
      data = copy->data();
    }
    Matrix m;
    m.dtype = t->dtype, m.rows = rows, m.cols = cols, m.data = data;
    return m;
  }

  std::vector<float> vector(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = find(name, shape);
    if (t == nullptr) return {};
    std::vector<uint8_t> aligned(t->data, t->data + t->nbytes);
    std::vector<float> out(static_cast<size_t>(t->numel()));
    convert_to_f32(t->dtype, aligned.data(), out.data(), out.size());
    return out;
  }

 private:
  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  const TensorSet& tensors_;
  VisionWeights& w_;
};

}  // namespace

int VisionConfig::position_side() const {
  return int(std::lround(std::sqrt(double(num_position_embeddings))));
}

std::optional<VisionConfig> VisionConfig::from_json(const nlohmann::json& root) {
  if (!root.is_object() || !root.contains("vision_config") || !root["vision_config"].is_object())
    return std::nullopt;
  const auto& j = root["vision_config"];
  VisionConfig c;
  c.depth = positive_int(j, "depth", 0, 1024);
  c.hidden_size = positive_int(j, "hidden_size", 0, 1 << 16);
  c.intermediate_size = positive_int(j, "intermediate_size", 0, 1 << 18);
  c.num_heads = positive_int(j, "num_heads", 0, 1024);
  c.out_hidden_size = positive_int(j, "out_hidden_size", 0, 1 << 16);
  c.num_position_embeddings = positive_int(j, "num_position_embeddings", 0, 1 << 20);
  c.patch_size = positive_int(j, "patch_size", 16, 1024);
  c.temporal_patch_size = positive_int(j, "temporal_patch_size", 2, 16);
  c.spatial_merge_size = positive_int(j, "spatial_merge_size", 2, 16);
  check(positive_int(j, "in_channels", 3, 3) == 3, "config.json: vision_config.in_channels must be 3");
  check(c.hidden_size % c.num_heads == 0 && c.head_dim() % 4 == 0,
        "config.json: vision_config.hidden_size {} must split into {} heads of a multiple of 4",
        c.hidden_size, c.num_heads);
  int side = c.position_side();
  check(side * side == c.num_position_embeddings,
        "config.json: vision_config.num_position_embeddings {} is not a square", c.num_position_embeddings);
  if (j.contains("hidden_act")) {
    check(j["hidden_act"].is_string(), "config.json: vision_config.hidden_act must be a string");
    std::string act = j["hidden_act"].get<std::string>();
    check(act == "gelu_pytorch_tanh" || act == "gelu",
          "config.json: vision_config.hidden_act {} is not supported", act.substr(0, 64));
    c.gelu_tanh = act == "gelu_pytorch_tanh";
  }
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("rope_theta")) {
    check(j["rope_parameters"]["rope_theta"].is_number() &&
              j["rope_parameters"]["rope_theta"].get<double>() > 0,
          "config.json: vision_config.rope_parameters.rope_theta must be positive");
    c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  }
  // Qwen3-VL's deepstack mergers feed features into early language layers; Qwen3.5 has none.
  check(!j.contains("deepstack_visual_indexes") ||
            (j["deepstack_visual_indexes"].is_array() && j["deepstack_visual_indexes"].empty()),
        "config.json: deepstack_visual_indexes are not supported (Qwen3.5 has none)");
  c.image_token_id = token_id(root, "image_token_id");
  c.vision_start_token_id = token_id(root, "vision_start_token_id");
  c.vision_end_token_id = token_id(root, "vision_end_token_id");
  return c;
}

std::optional<VisionConfig> VisionConfig::from_dir(const std::string& dir) {
  auto path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path);
  check(in.good(), "cannot read {}", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return from_json(parse_bounded_json<nlohmann::json>(text.str()));
}

VisionWeights load_vision_weights(std::shared_ptr<const TensorSet> tensors, const VisionConfig& c) {
  VisionWeights w;
  w.config = c;
  w.storage.push_back(std::const_pointer_cast<TensorSet>(tensors));
  Loader a(*tensors, w);
  const int64_t h = c.hidden_size, f = c.intermediate_size,
                m = int64_t(h) * c.spatial_merge_size * c.spatial_merge_size;
  w.patch_embed = a.matrix("patch_embed.proj.weight",
                           {h, 3, c.temporal_patch_size, c.patch_size, c.patch_size}, h, c.patch_columns());
  w.patch_embed_b = a.vector("patch_embed.proj.bias", {h});
  w.pos_embed = a.vector("pos_embed.weight", {c.num_position_embeddings, h});
  w.blocks.resize(size_t(c.depth));
  for (int i = 0; i < c.depth; ++i) {
    std::string p = fmt::format("blocks.{}.", i);
    VisionBlockWeights& b = w.blocks[size_t(i)];
    b.norm1_w = a.vector(p + "norm1.weight", {h});
    b.norm1_b = a.vector(p + "norm1.bias", {h});
    b.norm2_w = a.vector(p + "norm2.weight", {h});
    b.norm2_b = a.vector(p + "norm2.bias", {h});
    b.qkv = a.matrix(p + "attn.qkv.weight", {3 * h, h}, 3 * h, h);
    b.qkv_b = a.vector(p + "attn.qkv.bias", {3 * h});
    b.proj = a.matrix(p + "attn.proj.weight", {h, h}, h, h);
    b.proj_b = a.vector(p + "attn.proj.bias", {h});
    b.fc1 = a.matrix(p + "mlp.linear_fc1.weight", {f, h}, f, h);
    b.fc1_b = a.vector(p + "mlp.linear_fc1.bias", {f});
    b.fc2 = a.matrix(p + "mlp.linear_fc2.weight", {h, f}, h, f);
    b.fc2_b = a.vector(p + "mlp.linear_fc2.bias", {h});
  }
  w.merger_norm_w = a.vector("merger.norm.weight", {h});
  w.merger_norm_b = a.vector("merger.norm.bias", {h});
  w.merger_fc1 = a.matrix("merger.linear_fc1.weight", {m, m}, m, m);
  w.merger_fc1_b = a.vector("merger.linear_fc1.bias", {m});
  w.merger_fc2 = a.matrix("merger.linear_fc2.weight", {c.out_hidden_size, m}, c.out_hidden_size, m);
  w.merger_fc2_b = a.vector("merger.linear_fc2.bias", {c.out_hidden_size});
  if (!a.problems.empty()) {
    std::string list;
    for (size_t i = 0; i < a.problems.size() && i < 20; ++i) list += "\n  " + a.problems[i];
    fail("the vision tower's tensors do not match vision_config ({} problems):{}", a.problems.size(), list);
  }
  return w;
}

std::vector<float> resampled_positions(const VisionWeights& w, int grid_h, int grid_w) {
  const int side = w.config.position_side(), m = w.config.spatial_merge_size;
  const int64_t hidden = w.config.hidden_size;
  // torch.linspace(0, side - 1, n) in float32: the index each grid row / column samples the table at.
  auto sample = [&](int n) {
    std::vector<float> at(static_cast<size_t>(n));
    const float step = n > 1 ? float(side - 1) / float(n - 1) : 0.0f;
    for (int i = 0; i < n; ++i)
      at[size_t(i)] = i < n / 2 ? step * float(i) : float(side - 1) - step * float(n - 1 - i);
    return at;
  };
  std::vector<float> ys = sample(grid_h), xs = sample(grid_w);
  std::vector<float> out(static_cast<size_t>(int64_t(grid_h) * grid_w * hidden));
  // Rows in merge-block order (bh, bw, mh, mw), spread over the pool: at the release's 1152 columns a 1024²
  // image is 4096 rows of 4 table rows each, which one thread takes tens of milliseconds over (longer than
  // the GPU's whole tower).
  const int blocks_w = grid_w / m;
  ThreadPool::global().parallel_for(size_t(grid_h) * size_t(grid_w), [&](size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const int block = int(row / size_t(m * m)), within = int(row % size_t(m * m));
      const int bh = block / blocks_w, bw = block % blocks_w, mh = within / m, mw = within % m;
      const float y = ys[size_t(bh * m + mh)], x = xs[size_t(bw * m + mw)];
      const int y0 = int(y), x0 = int(x), y1 = std::min(y0 + 1, side - 1), x1 = std::min(x0 + 1, side - 1);
      const float dy = y - float(y0), dx = x - float(x0);
      const float wts[4] = {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx};
      const int idx[4] = {y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1};
      float* dst = &out[row * size_t(hidden)];
      for (int k = 0; k < 4; ++k) {
        const float* src = &w.pos_embed[size_t(int64_t(idx[k]) * hidden)];
        for (int64_t c = 0; c < hidden; ++c) dst[c] += src[c] * wts[k];
      }
    }
  });
  return out;
}

void vision_rotary(const VisionConfig& c, int grid_h, int grid_w, std::vector<float>& cos,
                   std::vector<float>& sin) {
  // The head splits into a row half and a column half, each rotating by its coordinate times
  // theta^(-4i/head_dim), i < head_dim/4 (HF's rotary of dim head_dim/2, in float32).
  const int half = c.head_dim() / 2, quarter = half / 2, m = c.spatial_merge_size;
  std::vector<float> inv(static_cast<size_t>(quarter));
  for (int i = 0; i < quarter; ++i)
    inv[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(half));
  const int64_t patches = int64_t(grid_h) * grid_w;
  cos.assign(size_t(patches * half), 0.0f);
  sin.assign(size_t(patches * half), 0.0f);
  int64_t row = 0;
  for (int bh = 0; bh < grid_h / m; ++bh)
    for (int bw = 0; bw < grid_w / m; ++bw)
      for (int mh = 0; mh < m; ++mh)
        for (int mw = 0; mw < m; ++mw, ++row) {
          const float r = float(bh * m + mh), col = float(bw * m + mw);
          for (int i = 0; i < half; ++i) {
            const float angle = i < quarter ? r * inv[size_t(i)] : col * inv[size_t(i - quarter)];
            cos[size_t(row * half + i)] = std::cos(angle);
            sin[size_t(row * half + i)] = std::sin(angle);
          }
        }
}

VisionTower::VisionTower(const VisionWeights& weights, Backend& backend) : w_(weights), b_(backend) {}

std::vector<float> VisionTower::encode(std::span<const ImagePatches* const> images, VisionTrace* trace) {
  const VisionConfig& c = w_.config;
  const int64_t hidden = c.hidden_size, cols = c.patch_columns(),
                unit = int64_t(c.spatial_merge_size) * c.spatial_merge_size;
  std::vector<int64_t> starts = {0};
  for (const ImagePatches* img : images) {
    check(img->grid_t == 1 && img->grid_h % c.spatial_merge_size == 0 &&
              img->grid_w % c.spatial_merge_size == 0 &&
              int64_t(img->pixel_values.size()) == img->patches() * cols,
          "vision: an image's patches do not match the tower (grid {}x{}, {} values)", img->grid_h,
          img->grid_w, img->pixel_values.size());
    starts.push_back(starts.back() + img->patches());
  }
  const int64_t n = starts.back();
  if (n == 0) return {};
  auto host_of = [&](const float* x, int64_t count) {
    std::vector<float> h(static_cast<size_t>(count));
    b_.download(x, h.data(), h.size());
    return h;
  };

  // Inputs of the whole batch on the host: pixels, resampled positions, rotary tables.
  std::vector<float> pixels, positions, cos, sin;
  pixels.reserve(size_t(n * cols));
  for (const ImagePatches* img : images) {
    pixels.insert(pixels.end(), img->pixel_values.begin(), img->pixel_values.end());
    std::vector<float> p = resampled_positions(w_, img->grid_h, img->grid_w), ic, is;
    positions.insert(positions.end(), p.begin(), p.end());
    vision_rotary(c, img->grid_h, img->grid_w, ic, is);
    cos.insert(cos.end(), ic.begin(), ic.end());
    sin.insert(sin.end(), is.begin(), is.end());
  }

  auto px = b_.allocate(size_t(n * cols));
  b_.upload(pixels.data(), px.get(), pixels.size());
  auto x = b_.allocate(size_t(n * hidden));
  b_.matmul(px.get(), n, w_.patch_embed, x.get());
  b_.add_bias(x.get(), w_.patch_embed_b.data(), n, hidden);
  if (trace) trace->patch_embed = host_of(x.get(), n * hidden);
  auto pos = b_.allocate(size_t(n * hidden));
  b_.upload(positions.data(), pos.get(), positions.size());
  b_.add(x.get(), pos.get(), size_t(n * hidden));
  if (trace) {
    trace->block_input = host_of(x.get(), n * hidden);
    trace->rotary_cos = cos, trace->rotary_sin = sin;
    trace->blocks.clear();
  }

  const int hd = c.head_dim();
  auto rotary = b_.allocate(cos.size() + sin.size());  // [cos | sin] for every block's rope_table
  b_.upload(cos.data(), rotary.get(), cos.size());
  b_.upload(sin.data(), rotary.get() + cos.size(), sin.size());
  auto normed = b_.allocate(size_t(n * hidden)), qkv = b_.allocate(size_t(n * 3 * hidden));
  auto attn = b_.allocate(size_t(n * hidden)), y = b_.allocate(size_t(n * hidden));
  auto mid = b_.allocate(size_t(n * c.intermediate_size));
  for (const VisionBlockWeights& blk : w_.blocks) {
    b_.layer_norm(x.get(), n, hidden, blk.norm1_w.data(), blk.norm1_b.data(), c.layer_norm_eps, normed.get());
    b_.matmul(normed.get(), n, blk.qkv, qkv.get());
    b_.add_bias(qkv.get(), blk.qkv_b.data(), n, 3 * hidden);
    // q and k rotate in place inside the interleaved [q | k | v] rows.
    for (int part = 0; part < 2; ++part)
      b_.rope_table(qkv.get() + part * hidden, n, 3 * hidden, c.num_heads, hd, hd, rotary.get(),
                    rotary.get() + cos.size());
    b_.segment_attention(qkv.get(), qkv.get() + hidden, qkv.get() + 2 * hidden, 3 * hidden, c.num_heads, hd,
                         starts, attn.get());
    b_.matmul(attn.get(), n, blk.proj, y.get());
    b_.add_bias(y.get(), blk.proj_b.data(), n, hidden);
    b_.add(x.get(), y.get(), size_t(n * hidden));
    b_.layer_norm(x.get(), n, hidden, blk.norm2_w.data(), blk.norm2_b.data(), c.layer_norm_eps, normed.get());
    b_.matmul(normed.get(), n, blk.fc1, mid.get());
    b_.add_bias(mid.get(), blk.fc1_b.data(), n, c.intermediate_size);
    b_.gelu(mid.get(), size_t(n * c.intermediate_size), c.gelu_tanh);
    b_.matmul(mid.get(), n, blk.fc2, y.get());
    b_.add_bias(y.get(), blk.fc2_b.data(), n, hidden);
    b_.add(x.get(), y.get(), size_t(n * hidden));
    if (trace) trace->blocks.push_back(host_of(x.get(), n * hidden));
  }

  // The merger: a merge block's rows are consecutive, so [n][hidden] read as [n/unit][unit·hidden] is the
  // concatenation.
  const int64_t tokens = n / unit, wide = unit * hidden;
  b_.layer_norm(x.get(), n, hidden, w_.merger_norm_w.data(), w_.merger_norm_b.data(), c.layer_norm_eps,
                normed.get());
  auto h1 = b_.allocate(size_t(tokens * wide));
  b_.matmul(normed.get(), tokens, w_.merger_fc1, h1.get());
  b_.add_bias(h1.get(), w_.merger_fc1_b.data(), tokens, wide);
  b_.gelu(h1.get(), size_t(tokens * wide), false);
  auto out = b_.allocate(size_t(tokens * c.out_hidden_size));
  b_.matmul(h1.get(), tokens, w_.merger_fc2, out.get());
  b_.add_bias(out.get(), w_.merger_fc2_b.data(), tokens, c.out_hidden_size);
  return host_of(out.get(), tokens * c.out_hidden_size);
}

}  // namespace moeserve
