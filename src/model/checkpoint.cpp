#include "model/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/error.h"
#include "model/safetensors.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

// At most this many problems are spelled out; a checkpoint of the wrong model would list thousands.
constexpr size_t kMaxListedProblems = 100;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool is_matrix_dtype(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::F8_E4M3;
}
bool is_vector_dtype(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::F64;
}

// Walks the config's expected tensors, takes each from the TensorSet, checks its shape and dtype, and turns
// it into a view. Problems are collected rather than thrown, so one error can name all of them.
class Assembler {
 public:
  Assembler(const ModelConfig& config, const TensorSet& tensors, std::vector<std::shared_ptr<void>>& storage)
      : config_(config), tensors_(tensors), storage_(storage) {}

  std::vector<std::string> problems;
  std::unordered_set<std::string> used;

  const TensorInfo* take(const std::string& name) {
    const TensorInfo* t = tensors_.find(name);
    if (t) used.insert(name);
    return t;
  }

  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo* t = take(name);
    if (!t) {
      problems.push_back(fmt::format("missing {} (expected [{}, {}])", name, rows, cols));
      return {};
    }
    if (!matrix_ok(*t, {rows, cols})) return {};
    const float* scales = nullptr;
    if (t->dtype == DType::F8_E4M3 && !(scales = fp8_scales(*t))) return {};
    return view(*t, aligned(*t), scales, rows, cols);
  }

  // Rows [row0, row0 + rows) of slice e of a fused 3-D tensor [E, R, C] (checked by the caller).
  Matrix slice(const TensorInfo& t, const uint8_t* base, const float* scales, int64_t e, int64_t row0,
               int64_t rows) {
    int64_t r = t.shape[1], c = t.shape[2];
    const uint8_t* data = base + size_t((e * r + row0) * c) * dtype_size(t.dtype);
    if (scales) {
      int64_t bo = config_.fp8->block_out, bi = config_.fp8->block_in;
      scales += (e * ceil_div(r, bo) + row0 / bo) * ceil_div(c, bi);
    }
    return view(t, data, scales, rows, c);
  }

  // Checks a tensor that holds matrices (2-D, or 3-D fused experts) against the expected shape.
  bool matrix_ok(const TensorInfo& t, const std::vector<int64_t>& shape) {
    if (!is_matrix_dtype(t.dtype)) {
      problems.push_back(
          fmt::format("{} has dtype {}, expected BF16, F16, F32 or F8_E4M3", t.name, dtype_name(t.dtype)));
      return false;
    }
    if (t.shape != shape) {
      problems.push_back(
          fmt::format("{} has shape {}, expected {}", t.name, shape_string(t.shape), shape_string(shape)));
      return false;
    }
    return true;
  }

  // The float32 block scales of an FP8 tensor [..., R, C]: NAME_scale_inv [..., ceil(R/bo), ceil(C/bi)].
  const float* fp8_scales(const TensorInfo& t) {
    if (!config_.fp8) {
      problems.push_back(fmt::format("{} is F8_E4M3 but config.json has no fp8 quantization_config", t.name));
      return nullptr;
    }
    std::string name = t.name + "_scale_inv";
    const TensorInfo* s = take(name);
    std::vector<int64_t> shape = t.shape;
    shape[shape.size() - 2] = ceil_div(shape[shape.size() - 2], config_.fp8->block_out);
    shape.back() = ceil_div(shape.back(), config_.fp8->block_in);
    if (!s) {
      problems.push_back(fmt::format("missing {} (block scales of the FP8 weight {}, expected {})", name,
                                     t.name, shape_string(shape)));
      return nullptr;
    }
    if (s->shape != shape || !is_vector_dtype(s->dtype)) {
      problems.push_back(fmt::format("{} is {}, expected F32 {} for {}x{} blocks", name, s->describe(),
                                     shape_string(shape), config_.fp8->block_out, config_.fp8->block_in));
      return nullptr;
    }
    if (s->dtype == DType::F32 && reinterpret_cast<uintptr_t>(s->data) % alignof(float) == 0)
      return reinterpret_cast<const float*>(s->data);
    return widen(*s)->data();
  }

  std::vector<float> vector(const std::string& name, const std::vector<int64_t>& shape,
                            const std::vector<int64_t>& alt_shape = {}) {
    const TensorInfo* t = take(name);
    if (!t) {
      problems.push_back(fmt::format("missing {} (expected {})", name, shape_string(shape)));
      return {};
    }
    if (!is_vector_dtype(t->dtype)) {
      problems.push_back(
          fmt::format("{} has dtype {}, expected BF16, F16, F32 or F64", name, dtype_name(t->dtype)));
      return {};
    }
    if (t->shape != shape && (alt_shape.empty() || t->shape != alt_shape)) {
      problems.push_back(
          fmt::format("{} has shape {}, expected {}", name, shape_string(t->shape), shape_string(shape)));
      return {};
    }
    return *widen(*t);
  }

  // An FP8 KV cache scale of an attention layer (NAME = k_scale or v_scale) where the checkpoint has one: a
  // scalar at self_attn.NAME, or where older exporters put it (self_attn.k_proj.NAME / v_proj,
  // self_attn.attn. NAME), as vLLM finds them; 0 when absent (the cache then uses 1.0).
  float kv_scale(const std::string& attn_prefix, const std::string& name) {
    const std::string proj = name == "k_scale" ? "k_proj." : "v_proj.";
    for (const std::string& full :
         {attn_prefix + name, attn_prefix + proj + name, attn_prefix + "attn." + name}) {
      const TensorInfo* t = take(full);
      if (!t) continue;
      if (!is_vector_dtype(t->dtype) || t->numel() != 1) {
        problems.push_back(
            fmt::format("{} is {}, expected one float (a per-tensor KV cache scale; per-head "
                        "scales are not supported)",
                        full, t->describe()));
        return 0;
      }
      const float v = widen(*t)->front();
      if (!(v > 0) || !std::isfinite(v)) {
        problems.push_back(fmt::format("{} is {}, expected a positive finite scale", full, v));
        return 0;
      }
      return v;
    }
    return 0;
  }

  void mlp(SwiGlu& w, const std::string& prefix, int64_t intermediate) {
    int64_t h = config_.hidden_size;
    w.gate = matrix(prefix + "gate_proj.weight", intermediate, h);
    w.up = matrix(prefix + "up_proj.weight", intermediate, h);
    w.down = matrix(prefix + "down_proj.weight", h, intermediate);
  }

  // Experts either fused (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) or one set of three
  // matrices per expert (experts.E.{gate,up,down}_proj.weight, what save_pretrained writes).
  void experts(MoeWeights& moe, const std::string& prefix) {
    int64_t e_count = config_.num_experts, inter = config_.moe_intermediate_size, h = config_.hidden_size;
    moe.experts.resize(size_t(e_count));
    if (!tensors_.find(prefix + "gate_up_proj")) {
      for (int64_t e = 0; e < e_count; ++e)
        mlp(moe.experts[size_t(e)], fmt::format("{}{}.", prefix, e), inter);
      return;
    }
    const TensorInfo* gu = take(prefix + "gate_up_proj");
    const TensorInfo* down = take(prefix + "down_proj");
    if (!down)
      problems.push_back(
          fmt::format("missing {}down_proj (expected [{}, {}, {}])", prefix, e_count, h, inter));
    bool ok = matrix_ok(*gu, {e_count, 2 * inter, h});
    ok = down && matrix_ok(*down, {e_count, h, inter}) && ok;
    if (!ok) return;
    const float* gu_scales = nullptr;
    const float* down_scales = nullptr;
    if (gu->dtype == DType::F8_E4M3) {
      if (!(gu_scales = fp8_scales(*gu))) return;
      if (inter % config_.fp8->block_out != 0) {
        problems.push_back(
            fmt::format("{}: moe_intermediate_size {} is not a multiple of the FP8 block ({}), so "
                        "gate and up cannot be split",
                        gu->name, inter, config_.fp8->block_out));
        return;
      }
    }
    if (down->dtype == DType::F8_E4M3 && !(down_scales = fp8_scales(*down))) return;
    const uint8_t* gu_data = aligned(*gu);
    const uint8_t* down_data = aligned(*down);
    for (int64_t e = 0; e < e_count; ++e) {
      auto& x = moe.experts[size_t(e)];
      x.gate = slice(*gu, gu_data, gu_scales, e, 0, inter);
      x.up = slice(*gu, gu_data, gu_scales, e, inter, inter);
      x.down = slice(*down, down_data, down_scales, e, 0, h);
    }
  }

 private:
  Matrix view(const TensorInfo& t, const uint8_t* data, const float* scales, int64_t rows,
              int64_t cols) const {
    Matrix m;
    m.dtype = t.dtype;
    m.rows = rows;
    m.cols = cols;
    m.data = data;
    if (scales) {
      m.scale_inv = scales;
      m.block_rows = config_.fp8->block_out;
      m.block_cols = config_.fp8->block_in;
    }
    return m;
  }

  // The tensor's bytes, copied into owned storage only when the file put them at an address that is not a
  // multiple of the element size (legal in safetensors, rare in practice).
  const uint8_t* aligned(const TensorInfo& t) {
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
    auto copy = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
    storage_.push_back(copy);
    return copy->data();
  }

  std::shared_ptr<std::vector<float>> widen(const TensorInfo& t) {
    auto out = std::make_shared<std::vector<float>>(size_t(t.numel()));
    convert_to_f32(t.dtype, aligned(t), out->data(), out->size());
    storage_.push_back(out);
    return out;
  }

  const ModelConfig& config_;
  const TensorSet& tensors_;
  std::vector<std::shared_ptr<void>>& storage_;
};

// One decoder layer's tensors under `p` ("model.layers.3.", "mtp.layers.0.").
void assemble_layer(Assembler& a, const ModelConfig& c, LayerWeights& l, const std::string& p) {
  int64_t h = c.hidden_size;
  l.input_norm = a.vector(p + "input_layernorm.weight", {h});
  l.post_norm = a.vector(p + "post_attention_layernorm.weight", {h});
  if (l.type == LayerType::LinearAttention) {
    std::string g = p + "linear_attn.";
    int64_t conv = c.linear_conv_dim(), hv = c.linear_num_value_heads;
    l.gdn.in_proj_qkv = a.matrix(g + "in_proj_qkv.weight", conv, h);
    l.gdn.in_proj_z = a.matrix(g + "in_proj_z.weight", c.linear_value_dim(), h);
    l.gdn.in_proj_b = a.matrix(g + "in_proj_b.weight", hv, h);
    l.gdn.in_proj_a = a.matrix(g + "in_proj_a.weight", hv, h);
    l.gdn.out_proj = a.matrix(g + "out_proj.weight", h, c.linear_value_dim());
    // Depthwise conv weight [C, 1, K]; the middle axis is the single input channel per group.
    l.gdn.conv1d =
        a.vector(g + "conv1d.weight", {conv, 1, c.linear_conv_kernel}, {conv, c.linear_conv_kernel});
    l.gdn.dt_bias = a.vector(g + "dt_bias", {hv});
    l.gdn.a_log = a.vector(g + "A_log", {hv});
    l.gdn.norm = a.vector(g + "norm.weight", {c.linear_value_head_dim});
  } else {
    std::string s = p + "self_attn.";
    int64_t hd = c.head_dim;
    l.attn.q_proj = a.matrix(s + "q_proj.weight", c.num_heads * 2 * hd, h);
    l.attn.k_proj = a.matrix(s + "k_proj.weight", c.num_kv_heads * hd, h);
    l.attn.v_proj = a.matrix(s + "v_proj.weight", c.num_kv_heads * hd, h);
    l.attn.o_proj = a.matrix(s + "o_proj.weight", h, c.num_heads * hd);
    l.attn.q_norm = a.vector(s + "q_norm.weight", {hd});
    l.attn.k_norm = a.vector(s + "k_norm.weight", {hd});
    l.attn.k_scale = a.kv_scale(s, "k_scale");
    l.attn.v_scale = a.kv_scale(s, "v_scale");
  }
  if (c.is_moe) {
    l.moe.router = a.matrix(p + "mlp.gate.weight", c.num_experts, h);
    a.experts(l.moe, p + "mlp.experts.");
    if (c.shared_expert_intermediate_size > 0) {
      a.mlp(l.moe.shared, p + "mlp.shared_expert.", c.shared_expert_intermediate_size);
      l.moe.shared_gate = a.matrix(p + "mlp.shared_expert_gate.weight", 1, h);
    }
  } else {
    a.mlp(l.mlp, p + "mlp.", c.intermediate_size);
  }
}

std::vector<int64_t> eos_from_generation_config(const fs::path& path) {
  if (!fs::exists(path)) return {};
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
  auto it = j.is_object() ? j.find("eos_token_id") : j.end();
  if (it == j.end() || it->is_null()) return {};
  if (it->is_number_integer()) return {it->get<int64_t>()};
  std::vector<int64_t> ids;
  check(it->is_array(), "{}: eos_token_id must be an integer or a list of integers", path.string());
  for (const auto& v : *it) {
    check(v.is_number_integer(), "{}: eos_token_id must hold integers", path.string());
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

}  // namespace

Checkpoint assemble_checkpoint(ModelConfig config, std::shared_ptr<const TensorSet> tensors,
                               const std::string& where) {
  Checkpoint ck;
  ck.tensors = tensors;
  ModelWeights& w = ck.weights;
  w.config = std::move(config);
  w.storage.push_back(std::const_pointer_cast<TensorSet>(tensors));
  const ModelConfig& c = w.config;
  Assembler a(c, *tensors, w.storage);

  // ForConditionalGeneration checkpoints nest the text model under model.language_model.
  std::string prefix =
      tensors->find("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  int64_t h = c.hidden_size;
  w.embed = a.matrix(prefix + "embed_tokens.weight", c.vocab_size, h);
  w.final_norm = a.vector(prefix + "norm.weight", {h});
  if (c.tie_word_embeddings) {
    a.take("lm_head.weight");  // some saves keep the tied copy; the embedding is what is used
    w.lm_head = w.embed;
  } else {
    w.lm_head = a.matrix("lm_head.weight", c.vocab_size, h);
  }

  w.layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[size_t(i)];
    l.type = c.layer_types[size_t(i)];
    assemble_layer(a, c, l, fmt::format("{}layers.{}.", prefix, i));
  }

  // The MTP layer (Qwen3.5 releases keep it at the top level, beside model.*): one full-attention layer.
  // Assembled apart so that incomplete MTP tensors cost only speculative decoding, not the model.
  if (tensors->find("mtp.fc.weight")) {
    Assembler m(c, *tensors, w.storage);
    MtpWeights mtp;
    mtp.fc = m.matrix("mtp.fc.weight", h, 2 * h);
    mtp.pre_fc_norm_embedding = m.vector("mtp.pre_fc_norm_embedding.weight", {h});
    mtp.pre_fc_norm_hidden = m.vector("mtp.pre_fc_norm_hidden.weight", {h});
    mtp.norm = m.vector("mtp.norm.weight", {h});
    mtp.layer.type = LayerType::FullAttention;
    assemble_layer(m, c, mtp.layer, "mtp.layers.0.");
    if (m.problems.empty()) {
      w.mtp = std::move(mtp);
    } else {
      ck.mtp_problem = fmt::format("{} problem{}, the first: {}", m.problems.size(),
                                   m.problems.size() == 1 ? "" : "s", m.problems.front());
    }
  }

  for (const auto& t : tensors->tensors()) {
    if (a.used.contains(t.name)) continue;
    if (t.name.starts_with("mtp.")) {
      ck.mtp_tensors.push_back(t.name);
    } else if (t.name.starts_with("model.visual.")) {
      ck.vision_tensors.push_back(t.name);
    } else {
      a.problems.push_back(fmt::format("unexpected tensor {} ({})", t.name, t.describe()));
    }
  }

  if (!a.problems.empty()) {
    std::string list;
    for (size_t i = 0; i < a.problems.size() && i < kMaxListedProblems; ++i) list += "\n  " + a.problems[i];
    if (a.problems.size() > kMaxListedProblems)
      list += fmt::format("\n  ... and {} more", a.problems.size() - kMaxListedProblems);
    fail("{}: the tensors do not match config.json ({}; {} problem{}):{}", where, c.summary(),
         a.problems.size(), a.problems.size() == 1 ? "" : "s", list);
  }
  return ck;
}

Checkpoint open_checkpoint(const std::string& dir) {
  check(fs::is_directory(dir), "{} is not a checkpoint directory", dir);
  ModelConfig config = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  if (config.eos_token_ids.empty())
    config.eos_token_ids = eos_from_generation_config(fs::path(dir) / "generation_config.json");
  auto tensors = std::make_shared<TensorSet>(TensorSet::open_dir(dir));
  Checkpoint ck = assemble_checkpoint(std::move(config), tensors, dir);
  spdlog::info(
      "loaded {}: {}; {} tensors, {:.1f} MiB{}{}", dir, ck.weights.config.summary(),
      tensors->tensors().size(), double(tensors->total_bytes()) / (1 << 20),
      ck.mtp_tensors.empty() ? ""
      : ck.weights.mtp       ? fmt::format(", MTP layer ({} tensors)", ck.mtp_tensors.size())
                       : fmt::format(", {} MTP tensors unusable: {}", ck.mtp_tensors.size(), ck.mtp_problem),
      ck.vision_tensors.empty() ? ""
                                : fmt::format(", {} vision tensors set aside", ck.vision_tensors.size()));
  return ck;
}

ModelWeights load_checkpoint(const std::string& dir) {
  return std::move(open_checkpoint(dir).weights);
}

}  // namespace moeserve
