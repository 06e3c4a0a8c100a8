#include "model/init_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "model/checkpoint.h"
#include "model/fp8_quantize.h"
#include "model/random_weights.h"
#include "model/safetensors.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- presets ---------------------------------------------------------------------------------------------

struct Preset {
  const char* name;
  bool moe;
  int64_t vocab, hidden;
  int layers, heads, kv_heads, head_dim;
  int lin_k_heads, lin_v_heads, lin_head_dim;
  int experts, top_k;
  int64_t moe_inter, shared_inter, dense_inter;
  bool tie;
  int mtp_layers;
};

// Shapes from docs/qwen35-model.md §1; tiny and small match the tiny-moe and small-moe-realdims fixtures.
constexpr Preset kPresets[] = {
    {"tiny", true, 512, 64, 4, 4, 2, 32, 2, 4, 16, 8, 2, 32, 32, 0, false, 0},
    {"small", true, 1024, 256, 4, 2, 1, 256, 2, 4, 128, 16, 4, 64, 64, 0, false, 0},
    {"35b-a3b", true, 248320, 2048, 40, 16, 2, 256, 16, 32, 128, 256, 8, 512, 512, 0, false, 1},
    {"122b-a10b", true, 248320, 3072, 48, 32, 2, 256, 16, 64, 128, 256, 8, 1024, 1024, 0, false, 1},
    {"397b-a17b", true, 248320, 4096, 60, 32, 2, 256, 16, 64, 128, 512, 10, 1024, 1024, 0, false, 1},
    {"dense-0.8b", false, 248320, 1024, 24, 8, 2, 256, 16, 16, 128, 0, 0, 0, 0, 3584, true, 0},
};

// Qwen3.5's <|im_end|> and <|endoftext|>, the eos ids of the real vocabulary.
const std::vector<int64_t> kQwen35Eos = {248046, 248044};

// What Qwen's FP8 releases keep in BF16 (as in the small-moe-realdims-fp8 fixture).
const std::vector<std::string> kQwenNotConverted = {"lm_head",
                                                    "embed_tokens",
                                                    "mlp.gate",
                                                    "shared_expert_gate",
                                                    "linear_attn.in_proj_a",
                                                    "linear_attn.in_proj_b"};

// ---- the tensor plan -------------------------------------------------------------------------------------

enum class Init { Matrix, Embedding, ZeroCentredNorm, UnitNorm, ALog, DtBias, Conv, Bias };

struct Planned {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  int64_t fan_in = 0;  // a Matrix whose inputs are not its last axis (the Conv3d patch embedding)
};

// model.visual.* of a tower of shape v (docs/vision.md); the merger's output is the text model's hidden size.
void plan_vision(const ModelConfig& c, const VisionShape& v, std::vector<Planned>& out) {
  const int64_t h = v.hidden, f = v.intermediate, m = 4 * h;
  const std::string p = "model.visual.";
  auto linear = [&](const std::string& n, int64_t rows, int64_t cols) {
    out.push_back({p + n + ".weight", {rows, cols}, Init::Matrix});
    out.push_back({p + n + ".bias", {rows}, Init::Bias});
  };
  auto layer_norm = [&](const std::string& n, int64_t size) {
    out.push_back({p + n + ".weight", {size}, Init::UnitNorm});
    out.push_back({p + n + ".bias", {size}, Init::Bias});
  };
  out.push_back({p + "patch_embed.proj.weight", {h, 3, 2, 16, 16}, Init::Matrix, 3 * 2 * 16 * 16});
  out.push_back({p + "patch_embed.proj.bias", {h}, Init::Bias});
  out.push_back({p + "pos_embed.weight", {v.position_embeddings, h}, Init::Embedding});
  for (int i = 0; i < v.depth; ++i) {
    std::string b = fmt::format("blocks.{}.", i);
    layer_norm(b + "norm1", h);
    layer_norm(b + "norm2", h);
    linear(b + "attn.qkv", 3 * h, h);
    linear(b + "attn.proj", h, h);
    linear(b + "mlp.linear_fc1", f, h);
    linear(b + "mlp.linear_fc2", h, f);
  }
  layer_norm("merger.norm", h);
  linear("merger.linear_fc1", m, m);
  linear("merger.linear_fc2", c.hidden_size, m);
}

// Every tensor of the checkpoint, named as transformers 5.17 saves a ...ForCausalLM (per-expert experts).
std::vector<Planned> plan(const ModelConfig& c, bool with_mtp, bool with_vision) {
  std::vector<Planned> out;
  // A ...ForConditionalGeneration checkpoint nests the text model under model.language_model.
  const std::string text = with_vision ? "model.language_model." : "model.";
  const int64_t h = c.hidden_size;
  auto matrix = [&](const std::string& n, int64_t rows, int64_t cols) {
    out.push_back({n, {rows, cols}, Init::Matrix});
  };
  auto vec = [&](const std::string& n, int64_t size, Init init) { out.push_back({n, {size}, init}); };
  auto mlp = [&](const std::string& p, int64_t inter) {
    matrix(p + "gate_proj.weight", inter, h);
    matrix(p + "up_proj.weight", inter, h);
    matrix(p + "down_proj.weight", h, inter);
  };
  auto layer = [&](const std::string& p, LayerType type) {
    vec(p + "input_layernorm.weight", h, Init::ZeroCentredNorm);
    if (type == LayerType::LinearAttention) {
      std::string g = p + "linear_attn.";
      int64_t hv = c.linear_num_value_heads;
      matrix(g + "in_proj_qkv.weight", c.linear_conv_dim(), h);
      matrix(g + "in_proj_z.weight", c.linear_value_dim(), h);
      matrix(g + "in_proj_b.weight", hv, h);
      matrix(g + "in_proj_a.weight", hv, h);
      out.push_back({g + "conv1d.weight", {c.linear_conv_dim(), 1, c.linear_conv_kernel}, Init::Conv});
      vec(g + "dt_bias", hv, Init::DtBias);
      vec(g + "A_log", hv, Init::ALog);
      vec(g + "norm.weight", c.linear_value_head_dim, Init::UnitNorm);
      matrix(g + "out_proj.weight", h, c.linear_value_dim());
    } else {
      std::string s = p + "self_attn.";
      matrix(s + "q_proj.weight", int64_t(c.num_heads) * 2 * c.head_dim, h);
      matrix(s + "k_proj.weight", int64_t(c.num_kv_heads) * c.head_dim, h);
      matrix(s + "v_proj.weight", int64_t(c.num_kv_heads) * c.head_dim, h);
      matrix(s + "o_proj.weight", h, int64_t(c.num_heads) * c.head_dim);
      vec(s + "q_norm.weight", c.head_dim, Init::ZeroCentredNorm);
      vec(s + "k_norm.weight", c.head_dim, Init::ZeroCentredNorm);
    }
    vec(p + "post_attention_layernorm.weight", h, Init::ZeroCentredNorm);
    if (c.is_moe) {
      matrix(p + "mlp.gate.weight", c.num_experts, h);
      for (int e = 0; e < c.num_experts; ++e)
        mlp(fmt::format("{}mlp.experts.{}.", p, e), c.moe_intermediate_size);
      if (c.shared_expert_intermediate_size > 0) {
        mlp(p + "mlp.shared_expert.", c.shared_expert_intermediate_size);
        matrix(p + "mlp.shared_expert_gate.weight", 1, h);
      }
    } else {
      mlp(p + "mlp.", c.intermediate_size);
    }
  };

  out.push_back({text + "embed_tokens.weight", {c.vocab_size, h}, Init::Embedding});
  for (int i = 0; i < c.num_layers; ++i)
    layer(fmt::format("{}layers.{}.", text, i), c.layer_types[size_t(i)]);
  vec(text + "norm.weight", h, Init::ZeroCentredNorm);
  if (!c.tie_word_embeddings) matrix("lm_head.weight", c.vocab_size, h);
  // Multi-token prediction: fc over [embedding; hidden], its norms, then full-attention decoder layers.
  if (with_mtp && c.mtp_num_layers > 0) {
    matrix("mtp.fc.weight", h, 2 * h);
    vec("mtp.pre_fc_norm_embedding.weight", h, Init::ZeroCentredNorm);
    vec("mtp.pre_fc_norm_hidden.weight", h, Init::ZeroCentredNorm);
    vec("mtp.norm.weight", h, Init::ZeroCentredNorm);
    for (int i = 0; i < c.mtp_num_layers; ++i)
      layer(fmt::format("mtp.layers.{}.", i), LayerType::FullAttention);
  }
  if (with_vision) plan_vision(c, default_vision_shape(c), out);
  return out;
}

// ---- values ----------------------------------------------------------------------------------------------

// splitmix64: element i of a tensor is a pure function of (seed, name, i), so the bytes do not depend on the
// thread count or on whether the tensor is written or kept in memory.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix(seed ^ h);
}

// out[j] = offset + scale * z(begin + j), where z is the sum of four uniform bytes, centred and scaled to
// unit variance: near-normal, bounded by ±3.46. One hash gives two values.
void normals(uint64_t key, uint64_t begin, size_t n, float scale, float offset, float* out) {
  const float k = scale * 1.7320508f / 256.0f;  // sqrt(12 / 4) / 256
  for (size_t j = 0; j < n;) {
    uint64_t i = begin + j;
    uint64_t r = mix(key + i / 2);
    for (uint64_t half = i & 1; half < 2 && j < n; ++half, ++j) {
      uint32_t bits = uint32_t(r >> (32 * half));
      float s =
          float(bits & 0xff) + float((bits >> 8) & 0xff) + float((bits >> 16) & 0xff) + float(bits >> 24);
      out[j] = offset + k * (s - 510.0f);  // mean of the sum of four bytes is 4 * 127.5
    }
  }
}

float uniform(uint64_t key, uint64_t i) {
  return float(mix(key + i) >> 40) * 0x1p-24f;
}

void generate(const Planned& t, uint64_t key, uint64_t begin, size_t n, float* out) {
  switch (t.init) {
    case Init::Matrix:
    case Init::Conv:
      return normals(key, begin, n, 1.0f / std::sqrt(float(t.fan_in > 0 ? t.fan_in : t.shape.back())), 0.0f,
                     out);
    case Init::Bias:
      return normals(key, begin, n, 0.02f, 0.0f, out);
    case Init::Embedding:
      return normals(key, begin, n, 1.0f, 0.0f, out);
    case Init::ZeroCentredNorm:
      return normals(key, begin, n, 0.1f, 0.0f, out);
    case Init::UnitNorm:
    case Init::DtBias:
      return normals(key, begin, n, 0.1f, 1.0f, out);
    case Init::ALog:
      for (size_t i = 0; i < n; ++i) out[i] = std::log(1.0f + 15.0f * uniform(key, begin + i));
      return;
  }
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// A module named by a modules_to_not_convert entry: whole dotted components, so "mlp.gate" keeps the router
// (mlp.gate.weight) in BF16 but not a dense mlp.gate_proj.
bool not_converted(const std::string& name, const std::vector<std::string>& patterns) {
  std::string module = "." + name.substr(0, name.rfind('.')) + ".";
  for (const auto& p : patterns)
    if (module.find("." + p + ".") != std::string::npos) return true;
  return false;
}

// The tensors to write for one planned tensor: BF16, or an FP8 weight and its block scales.
void materialize(const Planned& t, const ModelConfig& c, uint64_t seed, DType dtype,
                 std::vector<TensorWrite>& out) {
  const uint64_t key = tensor_key(seed, t.name);
  // The vision tower stays BF16, as in Qwen's FP8 releases.
  bool fp8 = dtype == DType::F8_E4M3 && t.init == Init::Matrix && !t.name.starts_with("model.visual.") &&
             !not_converted(t.name, c.fp8->modules_to_not_convert);
  if (!fp8) {
    auto fill = [t, key](uint8_t* dst) {
      constexpr size_t kChunk = 1 << 14;
      size_t n = size_t(numel(t.shape));
      ThreadPool::global().parallel_for((n + kChunk - 1) / kChunk, [&](size_t b, size_t e) {
        std::vector<float> values(kChunk);
        for (size_t chunk = b; chunk < e; ++chunk) {
          size_t begin = chunk * kChunk, len = std::min(kChunk, n - begin);
          generate(t, key, begin, len, values.data());
          auto* out16 = reinterpret_cast<uint16_t*>(dst) + begin;
          for (size_t i = 0; i < len; ++i) out16[i] = f32_to_bf16(values[i]);
        }
      });
    };
    out.push_back({t.name, DType::BF16, t.shape, fill});
    return;
  }
  // Both tensors come from the same values: the weight fill quantises, the scale fill only needs block
  // maxima.
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int bo = c.fp8->block_out, bi = c.fp8->block_in;
  const int64_t bands = (rows + bo - 1) / bo, scale_cols = (cols + bi - 1) / bi;
  auto quantize = [=](uint8_t* weights, float* scales) {
    ThreadPool::global().parallel_for(size_t(bands), [&](size_t b, size_t e) {
      std::vector<float> values(size_t(bo * cols));
      std::vector<float> band_scales(static_cast<size_t>(scale_cols));
      for (size_t band = b; band < e; ++band) {
        int64_t r0 = int64_t(band) * bo, n = std::min<int64_t>(bo, rows - r0);
        generate(t, key, uint64_t(r0 * cols), size_t(n * cols), values.data());
        if (weights)
          quantize_fp8_band(values.data(), n, cols, bi, weights + r0 * cols, band_scales.data());
        else
          fp8_band_scales(values.data(), n, cols, bi, scales + int64_t(band) * scale_cols);
      }
    });
  };
  out.push_back({t.name, DType::F8_E4M3, t.shape, [quantize](uint8_t* dst) { quantize(dst, nullptr); }});
  out.push_back({t.name + "_scale_inv", DType::F32, {bands, scale_cols}, [quantize](uint8_t* dst) {
                   quantize(nullptr, reinterpret_cast<float*>(dst));
                 }});
}

// MTP tensors are written to checkpoints (the real layout) but not built in memory: the text model never
// reads them.
std::vector<TensorWrite> checkpoint_tensors(const ModelConfig& c, uint64_t seed, DType dtype, bool with_mtp,
                                            bool with_vision = false) {
  check(dtype == DType::BF16 || dtype == DType::F8_E4M3, "random weights can be BF16 or F8_E4M3, not {}",
        dtype_name(dtype));
  std::vector<TensorWrite> out;
  for (const auto& t : plan(c, with_mtp, with_vision)) materialize(t, c, seed, dtype, out);
  return out;
}

void prepare(ModelConfig& c, DType dtype) {
  if (dtype == DType::F8_E4M3 && !c.fp8) c.fp8 = Fp8Quantization{128, 128, kQwenNotConverted};
}

// ---- tokenizer -------------------------------------------------------------------------------------------

struct TokenizerFacts {
  int64_t size = 0;  // highest id + 1
  std::vector<int64_t> eos;
  std::map<std::string, int64_t> ids;
};

TokenizerFacts read_tokenizer(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot open {}", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", path, e.what());
  }
  check(j.is_object() && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab") &&
            j["model"]["vocab"].is_object(),
        "{}: not a tokenizer.json (no model.vocab object)", path);
  TokenizerFacts f;
  std::map<std::string, int64_t>& ids = f.ids;
  auto note = [&](const std::string& token, const json& id) {
    check(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: token '{}' has a bad id", path, token);
    ids[token] = id.get<int64_t>();
    f.size = std::max(f.size, id.get<int64_t>() + 1);
  };
  for (const auto& [token, id] : j["model"]["vocab"].items()) note(token, id);
  if (auto added = j.find("added_tokens"); added != j.end() && added->is_array())
    for (const auto& t : *added)
      if (t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id"))
        note(t["content"].get<std::string>(), t["id"]);
  for (const char* eos : {"<|im_end|>", "<|endoftext|>"})
    if (auto it = ids.find(eos); it != ids.end()) f.eos.push_back(it->second);
  check(f.size > 0, "{}: the vocabulary is empty", path);
  return f;
}

void copy_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  // --out may be the directory the tokenizer comes from: the file is already in place, and copy_file refuses
  // to copy a file onto itself (EEXIST, even with overwrite_existing).
  if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  check(!ec, "cannot copy {} to {}: {}", from.string(), to.string(), ec.message());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  check(out.good(), "cannot write {}", path.string());
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return names;
}

ModelConfig preset_config(const std::string& name, int layers) {
  const Preset* p = nullptr;
  for (const auto& candidate : kPresets)
    if (name == candidate.name) p = &candidate;
  check(p != nullptr, "unknown preset '{}' (known: {})", name, fmt::join(preset_names(), ", "));
  check(layers >= 0, "--layers must be positive");
  ModelConfig c;
  c.is_moe = p->moe;
  c.model_type = p->moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  c.architecture = p->moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM";
  c.dtype = "bfloat16";
  c.vocab_size = p->vocab;
  c.hidden_size = p->hidden;
  c.num_layers = layers > 0 ? layers : p->layers;
  for (int i = 0; i < c.num_layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = p->tie;
  c.max_position_embeddings = 262144;
  c.num_heads = p->heads;
  c.num_kv_heads = p->kv_heads;
  c.head_dim = p->head_dim;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25;
  c.linear_num_key_heads = p->lin_k_heads;
  c.linear_num_value_heads = p->lin_v_heads;
  c.linear_key_head_dim = c.linear_value_head_dim = p->lin_head_dim;
  c.linear_conv_kernel = 4;
  c.num_experts = p->experts;
  c.num_experts_per_tok = p->top_k;
  c.moe_intermediate_size = p->moe_inter;
  c.shared_expert_intermediate_size = p->shared_inter;
  c.intermediate_size = p->dense_inter;
  c.mtp_num_layers = p->mtp_layers;
  if (c.vocab_size == 248320) c.eos_token_ids = kQwen35Eos;
  return c;
}

// The nested config.json of a ...ForConditionalGeneration checkpoint: the text config under text_config, the
// tower's vision_config and the vision token ids (the tokenizer's own when there is one; otherwise Qwen3.5's
// for its vocabulary, or the last ids of a small one as in the tiny-moe-vl-image fixture).
json vision_config_json(const ModelConfig& c, const TokenizerFacts& tokenizer, const VisionShape& v) {
  json root;
  root["architectures"] = {c.is_moe ? "Qwen3_5MoeForConditionalGeneration"
                                    : "Qwen3_5ForConditionalGeneration"};
  root["model_type"] = c.is_moe ? "qwen3_5_moe" : "qwen3_5";
  root["text_config"] = c.to_json();
  // dtype and quantization_config are read at the top level of a nested config.
  for (const char* key : {"dtype", "quantization_config"}) {
    if (!root["text_config"].contains(key)) continue;
    root[key] = root["text_config"][key];
    root["text_config"].erase(key);
  }
  root["tie_word_embeddings"] = c.tie_word_embeddings;
  root["vision_config"] = {{"depth", v.depth},
                           {"hidden_size", v.hidden},
                           {"intermediate_size", v.intermediate},
                           {"num_heads", v.heads},
                           {"num_position_embeddings", v.position_embeddings},
                           {"out_hidden_size", c.hidden_size},
                           {"patch_size", 16},
                           {"temporal_patch_size", 2},
                           {"spatial_merge_size", 2},
                           {"in_channels", 3},
                           {"hidden_act", "gelu_pytorch_tanh"},
                           {"model_type", c.is_moe ? "qwen3_5_moe_vision" : "qwen3_5_vision"}};
  const char* names[] = {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"};
  const char* keys[] = {"vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"};
  const int64_t qwen35[] = {248053, 248054, 248056, 248057}, tail[] = {8, 7, 5, 4};
  for (int i = 0; i < 4; ++i) {
    if (!tokenizer.ids.empty()) {
      auto it = tokenizer.ids.find(names[i]);
      check(it != tokenizer.ids.end(), "--vision: the tokenizer has no {} token", names[i]);
      root[keys[i]] = it->second;
    } else {
      root[keys[i]] = c.vocab_size == 248320 ? qwen35[i] : c.vocab_size - tail[i];
    }
  }
  return root;
}

ModelConfig init_model(ModelConfig config, const std::string& dir, const InitModelOptions& options) {
  TokenizerFacts tokenizer;
  if (!options.vocab_from.empty()) {
    tokenizer = read_tokenizer(options.vocab_from);
    config.vocab_size = (tokenizer.size + 255) / 256 * 256;
    config.eos_token_ids = tokenizer.eos;
  }
  prepare(config, options.dtype);
  if (options.vision) add_mrope_sections(config);
  auto tensors = checkpoint_tensors(config, options.seed, options.dtype, true, options.vision);
  write_safetensors_dir(dir, tensors, options.max_shard_bytes);
  json written =
      options.vision ? vision_config_json(config, tokenizer, default_vision_shape(config)) : config.to_json();
  write_text(fs::path(dir) / "config.json", written.dump(2) + "\n");
  json generation = json::object();
  if (config.eos_token_ids.size() == 1) generation["eos_token_id"] = config.eos_token_ids[0];
  if (config.eos_token_ids.size() > 1) generation["eos_token_id"] = config.eos_token_ids;
  write_text(fs::path(dir) / "generation_config.json", generation.dump(2) + "\n");

  if (!options.vocab_from.empty()) {
    fs::path beside = fs::path(options.vocab_from).parent_path();
    copy_into(options.vocab_from, fs::path(dir) / "tokenizer.json");
    for (const char* extra : {"tokenizer_config.json", "chat_template.jinja"})
      if (fs::exists(beside / extra)) copy_into(beside / extra, fs::path(dir) / extra);
  }
  if (!options.chat_template.empty()) copy_into(options.chat_template, fs::path(dir) / "chat_template.jinja");
  size_t bytes = 0;
  for (const auto& t : tensors) bytes += t.nbytes();
  spdlog::info("wrote {}: {}; {} tensors, {:.1f} MiB, seed {}", dir, config.summary(), tensors.size(),
               double(bytes) / (1 << 20), options.seed);
  return config;
}

namespace {

std::shared_ptr<TensorSet> in_memory(std::vector<TensorWrite> tensors) {
  auto set = std::make_shared<TensorSet>();
  for (auto& t : tensors) {
    size_t n = t.nbytes();
    std::shared_ptr<uint8_t[]> buffer(new uint8_t[n]);
    t.fill(buffer.get());
    set->add(TensorInfo{t.name, t.dtype, t.shape, buffer.get(), n, "dummy weights"});
    set->keep_alive(std::move(buffer));
  }
  return set;
}

}  // namespace

ModelWeights make_dummy_weights(ModelConfig config, uint64_t seed, DType dtype) {
  prepare(config, dtype);
  auto set = in_memory(checkpoint_tensors(config, seed, dtype, true));
  return std::move(assemble_checkpoint(std::move(config), set, "dummy weights").weights);
}

ModelWeights make_dummy_weights_on(Backend& backend, const ModelConfig& config, uint64_t seed, bool fp8) {
  uint64_t next = seed * 1000003 + 1;
  bool on_backend = true;  // until the backend makes no matrix (the CPU's): then all on the host
  ModelWeights w = make_random_weights(
      config,
      [&](int64_t rows, int64_t cols, float bound, bool quantizable) {
        const DType dtype = fp8 && quantizable ? DType::F8_E4M3 : DType::BF16;
        Matrix m = on_backend ? backend.random_matrix(dtype, rows, cols, next++, bound) : Matrix{};
        on_backend = !m.empty();
        return m;
      },
      uint32_t(seed));
  check(on_backend || !fp8, "FP8 random weights are made on a GPU only (--device cuda)");
  return on_backend ? std::move(w) : make_dummy_weights(config, seed);
}

void add_mrope_sections(ModelConfig& config) {
  if (!config.mrope_section.empty()) return;
  // [11, 11, 10] of 32 frequencies in the release.
  const int half = config.rotary_dim() / 2, hw = int(std::lround(half * 11.0 / 32.0));
  config.mrope_section = {hw, hw, half - 2 * hw};
}

VisionShape default_vision_shape(const ModelConfig& config) {
  if (config.hidden_size < 1024) return {2, 64, 128, 2, 64};
  return {27, 1152, 4304, 16, 2304};
}

nlohmann::json dummy_vision_config(const ModelConfig& config, const std::map<std::string, int64_t>& token_ids,
                                   const VisionShape& shape) {
  TokenizerFacts tokenizer;
  tokenizer.ids = token_ids;
  return vision_config_json(config, tokenizer, shape);
}

DummyVision make_dummy_vision(const ModelConfig& config, uint64_t seed,
                              const std::map<std::string, int64_t>& token_ids, const VisionShape& shape) {
  std::vector<Planned> planned;
  plan_vision(config, shape, planned);
  std::vector<TensorWrite> tensors;
  for (const auto& t : planned) materialize(t, config, seed, DType::BF16, tensors);
  return {in_memory(std::move(tensors)), dummy_vision_config(config, token_ids, shape)};
}

}  // namespace moeserve
