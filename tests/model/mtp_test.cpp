// The MTP layer (model/mtp.cpp) against Hugging Face's own decoder layer (mtp_reference.safetensors), and the
// checkpoint layouts it comes in: one file, shards with MTP tensors apart or mixed in, per-expert tensors,
// FP8.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "backend/backend.h"
#include "common/dtype.h"
#include "model/checkpoint.h"
#include "model/fp8_quantize.h"
#include "model/qwen35.h"
#include "model/sequence.h"
#include "model/verify.h"
#include "test_util.h"

namespace moeserve {
namespace {

using testing::rewrite_checkpoint;
using testing::TempDir;

const std::string kFixtures = "tests/fixtures/models/";
constexpr double kCpuTolerance = 1e-3;  // as the main model's CPU verify

ModelWeights load_for_reference(const std::string& dir) {
  ModelWeights w = load_checkpoint(dir);
  w.config.rope_bf16_inv_freq = true;  // the references ran with bf16-rounded RoPE frequencies
  return w;
}

// The MTP logits of every row of `ids` (one batched step from the model's own hidden states).
std::vector<float> mtp_logits(const ModelWeights& w, const std::vector<int32_t>& ids) {
  auto backend = make_cpu_backend();
  Qwen35Model model(w, *backend);
  SequenceRunner runner(model, int64_t(ids.size()));
  auto target = runner.prefill(ids, false, false, true);
  KvCache kv(model.mtp_kv_cache_spec(16, 4));
  std::vector<int32_t> pages{0, 1, 2, 3};
  std::vector<int32_t> rows(ids.begin() + 1, ids.end());
  rows.push_back(argmax(target.logits));
  SequenceStep step{rows, 0, pages, 0, true};
  return model.mtp_forward({&step, 1}, target.hidden, kv).logits;
}

const std::vector<int32_t> kPrompt = {5, 77, 301, 12, 12, 490, 3, 250, 18, 64, 7, 99, 411, 2, 35, 200, 140};

class MtpReference : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpReference, LogitsAndChainedDraftsMatchHuggingFace) {
  const std::string dir = kFixtures + GetParam();
  ModelWeights w = load_for_reference(dir);
  ASSERT_TRUE(w.mtp.has_value());
  auto backend = make_cpu_backend();
  Qwen35Model model(w, *backend);
  const TensorSet reference = TensorSet::open_file(dir + "/mtp_reference.safetensors");
  auto report = verify_mtp_against_reference(model, reference, {kCpuTolerance});
  ASSERT_EQ(report.cases.size(), 4u);
  for (const auto& c : report.cases) {
    EXPECT_LE(c.max_abs_error, kCpuTolerance) << c.name;
    EXPECT_EQ(c.tolerance, kCpuTolerance) << c.name;
    EXPECT_TRUE(c.tokens_match) << c.name << " differs at step " << c.first_mismatch;
    EXPECT_EQ(c.generated_tokens, c.name.starts_with("chain") ? 3 : 0) << c.name;
  }
  EXPECT_TRUE(report.passed);

  // The bound of bf16 mode (verify --device cuda --matmul bf16): each case's own, the tolerance times
  // max(1, its largest |reference logit|), read from the reference here.
  VerifyOptions relative{kCpuTolerance};
  relative.relative = true;
  auto scaled = verify_mtp_against_reference(model, reference, relative);
  ASSERT_EQ(scaled.cases.size(), report.cases.size());
  for (size_t i = 0; i < scaled.cases.size(); ++i) {
    const auto& c = scaled.cases[i];
    const std::string key = c.name + ".logits";
    const TensorInfo* logits = reference.find(key);
    ASSERT_NE(logits, nullptr) << key;
    const auto* values = reinterpret_cast<const float*>(logits->data);
    double scale = 1;
    for (int64_t v = 0; v < logits->numel(); ++v) scale = std::max(scale, double(std::fabs(values[v])));
    EXPECT_DOUBLE_EQ(c.tolerance, kCpuTolerance * scale) << c.name;
    EXPECT_EQ(c.max_abs_error, report.cases[i].max_abs_error) << c.name;
  }
  EXPECT_TRUE(scaled.passed);
}

// The serving path (mtp_draft: hidden rows kept where the backend runs, gathered by index, greedy drafts
// found where the logits are) drafts exactly what the reference path (mtp_forward over host rows, argmax on
// the host) does: two sequences of one batched forward, then two chained draft steps from the MTP's own rows.
TEST_P(MtpReference, DraftsFromKeptHiddenRowsEqualTheHostPath) {
  ModelWeights w = load_for_reference(kFixtures + GetParam());
  const int64_t H = w.config.hidden_size, V = w.config.vocab_size;
  auto backend = make_cpu_backend();
  Qwen35Model model(w, *backend);
  model.prepare_mtp();
  const std::vector<int32_t> a(kPrompt.begin(), kPrompt.begin() + 9), b(kPrompt.begin() + 4, kPrompt.end());
  KvCache kv(model.kv_cache_spec(16, 4));
  StateCache state(model.state_cache_spec(2));
  const std::vector<int32_t> pages_a{0, 1}, pages_b{2, 3};
  SequenceStep target[2] = {{a, 0, pages_a, 0}, {b, 0, pages_b, 1}};
  target[0].hidden = target[1].hidden = true;
  model.forward(target, kv, state);
  std::vector<float> hidden;
  model.download_hidden(hidden);
  ASSERT_EQ(hidden.size(), (a.size() + b.size()) * size_t(H));

  // Row p of a sequence: token t_{p+1} (the last one a made-up next token) with hidden h_p.
  std::vector<int32_t> rows_a(a.begin() + 1, a.end()), rows_b(b.begin() + 1, b.end());
  rows_a.push_back(17);
  rows_b.push_back(300);
  SequenceStep steps[2] = {{rows_a, 0, pages_a, 0}, {rows_b, 0, pages_b, 1}};
  std::vector<int64_t> sources(a.size() + b.size());
  std::iota(sources.begin(), sources.end(), 0);
  KvCache kv_device(model.mtp_kv_cache_spec(16, 4)), kv_host(model.mtp_kv_cache_spec(16, 4));
  std::vector<int32_t> drafts = model.mtp_draft(steps, sources, true, kv_device);
  ForwardOutput host = model.mtp_forward(steps, hidden, kv_host);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("draft step " + std::to_string(step));
    ASSERT_EQ(drafts.size(), 2u);
    ASSERT_EQ(host.logits.size(), size_t(2 * V));
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(drafts[i], argmax({host.logits.data() + i * size_t(V), size_t(V)})) << "sequence " << i;
    if (step == 2) break;
    // The next row of each: its draft at the next position, fed the previous row's MTP hidden.
    const std::vector<int32_t> these = drafts;
    for (size_t i = 0; i < 2; ++i) {
      steps[i].start_pos += int64_t(steps[i].tokens.size());
      steps[i].tokens = {&these[i], 1};
    }
    const std::vector<int64_t> previous{0, 1};
    const std::vector<float> host_hidden = std::move(host.hidden);
    drafts = model.mtp_draft(steps, previous, false, kv_device);
    host = model.mtp_forward(steps, host_hidden, kv_host);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpReference, ::testing::Values("tiny-moe-mtp", "tiny-moe-vl-layout-mtp"));

// The MTP layer's KV cache is one layer with one pair of scales, whatever the main stack holds (a model of
// ten attention layers once refused its MTP cache: "10 scales for 1 attention layers").
TEST(MtpReference, MtpKvCacheOfAStackWithSeveralAttentionLayers) {
  ModelWeights w = load_for_reference(kFixtures + "tiny-moe-mtp");
  const auto layers = w.layers;
  const auto types = w.config.layer_types;
  w.layers.insert(w.layers.end(), layers.begin(), layers.end());
  w.config.layer_types.insert(w.config.layer_types.end(), types.begin(), types.end());
  w.config.num_layers *= 2;
  ASSERT_EQ(w.config.count_layers(LayerType::FullAttention), 2);
  auto backend = make_cpu_backend();
  Qwen35Model model(w, *backend);
  for (DType dt : {DType::F32, DType::BF16, DType::F8_E4M3}) {
    KvCacheSpec spec = model.mtp_kv_cache_spec(16, 4);
    spec.dtype = dt;
    KvCache kv(spec);
    EXPECT_EQ(kv.spec().num_layers, 1) << dtype_name(dt);
    EXPECT_EQ(kv.spec().k_scales.size(), 1u) << dtype_name(dt);
  }
}

TEST(MtpReference, ABrokenMtpWeightFailsTheCheck) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe-mtp", out.path(), [](std::vector<TensorWrite>& tensors) {
    for (auto& t : tensors)
      if (t.name == "mtp.pre_fc_norm_hidden.weight")
        t = TensorWrite::copy_of(t.name, DType::BF16, {64}, std::vector<uint8_t>(128, 0));
  });
  ModelWeights w = load_for_reference(out.path());
  auto backend = make_cpu_backend();
  Qwen35Model model(w, *backend);
  auto report = verify_mtp_against_reference(
      model, TensorSet::open_file(kFixtures + "tiny-moe-mtp/mtp_reference.safetensors"), {kCpuTolerance});
  EXPECT_FALSE(report.passed);
}

TEST(MtpCheckpoint, IncompleteMtpTensorsLeaveTheModelUsable) {
  TempDir out;
  rewrite_checkpoint(kFixtures + "tiny-moe-mtp", out.path(), [](std::vector<TensorWrite>& tensors) {
    testing::erase_tensor(tensors, "mtp.norm.weight");
  });
  Checkpoint ck = open_checkpoint(out.path());
  EXPECT_FALSE(ck.weights.mtp.has_value());
  EXPECT_THAT(ck.mtp_problem, ::testing::HasSubstr("missing mtp.norm.weight"));
  EXPECT_EQ(ck.weights.layers.size(), 4u);
}

// Sharded as the releases are (model.safetensors.index.json), the MTP tensors in a shard of their own or
// spread among the others, and with per-expert instead of fused expert tensors: the same MTP logits, bit for
// bit.
TEST(MtpCheckpoint, ShardedAndPerExpertLayoutsGiveTheSameLogits) {
  const std::string src = kFixtures + "tiny-moe-mtp";
  const std::vector<float> expected = mtp_logits(load_checkpoint(src), kPrompt);

  TempDir own_shard, mixed, per_expert;
  {  // two shards written by hand: the text model, then the MTP layer alone
    TensorSet set = TensorSet::open_dir(src);
    std::vector<TensorWrite> main, mtp;
    nlohmann::json index;
    for (const auto& t : set.tensors()) {
      const bool is_mtp = t.name.starts_with("mtp.");
      (is_mtp ? mtp : main).push_back(TensorWrite::copy_of(t.name, t.dtype, t.shape, {t.data, t.nbytes}));
      index["weight_map"][t.name] = is_mtp ? "model-mtp.safetensors" : "model-text.safetensors";
    }
    write_safetensors(own_shard / "model-text.safetensors", main);
    write_safetensors(own_shard / "model-mtp.safetensors", mtp);
    testing::write_json(own_shard / "model.safetensors.index.json", index);
    std::filesystem::copy_file(src + "/config.json", own_shard / "config.json");
  }
  rewrite_checkpoint(
      src, mixed.path(),
      [](std::vector<TensorWrite>& tensors) { std::reverse(tensors.begin(), tensors.end()); }, {}, 64 * 1024);
  rewrite_checkpoint(src, per_expert.path(), [](std::vector<TensorWrite>& tensors) {
    const std::string p = "mtp.layers.0.mlp.experts.";
    auto find = [&](const std::string& name) {
      return *std::find_if(tensors.begin(), tensors.end(),
                           [&](const TensorWrite& t) { return t.name == name; });
    };
    TensorWrite gate_up = find(p + "gate_up_proj"), down = find(p + "down_proj");
    std::vector<uint8_t> gu(gate_up.nbytes()), dn(down.nbytes());
    gate_up.fill(gu.data());
    down.fill(dn.data());
    testing::erase_tensor(tensors, p + "gate_up_proj");
    testing::erase_tensor(tensors, p + "down_proj");
    const int64_t E = 8, I = 32, H = 64;
    for (int64_t e = 0; e < E; ++e) {
      auto rows = [&](const std::vector<uint8_t>& b, int64_t first, int64_t count, int64_t cols) {
        return std::span<const uint8_t>(b.data() + size_t(first * cols * 2), size_t(count * cols * 2));
      };
      const std::string ep = p + std::to_string(e) + ".";
      tensors.push_back(
          TensorWrite::copy_of(ep + "gate_proj.weight", DType::BF16, {I, H}, rows(gu, e * 2 * I, I, H)));
      tensors.push_back(
          TensorWrite::copy_of(ep + "up_proj.weight", DType::BF16, {I, H}, rows(gu, e * 2 * I + I, I, H)));
      tensors.push_back(
          TensorWrite::copy_of(ep + "down_proj.weight", DType::BF16, {H, I}, rows(dn, e * H, H, I)));
    }
  });
  ASSERT_TRUE(std::filesystem::exists(own_shard / "model.safetensors.index.json"));
  ASSERT_TRUE(std::filesystem::exists(mixed / "model.safetensors.index.json"));
  // The shard holding mtp.fc.weight holds nothing but MTP tensors in the first layout, and other tensors too
  // in the second.
  auto shard_names = [](const std::string& dir) {
    auto index = testing::read_json(dir + "/model.safetensors.index.json")["weight_map"];
    const std::string mtp_file = index["mtp.fc.weight"];
    std::vector<std::string> names;
    for (const auto& [name, file] : index.items())
      if (file == mtp_file) names.push_back(name);
    return names;
  };
  auto own = shard_names(own_shard.path()), mix = shard_names(mixed.path());
  EXPECT_TRUE(std::all_of(own.begin(), own.end(), [](const auto& n) { return n.starts_with("mtp."); }))
      << ::testing::PrintToString(own);
  EXPECT_FALSE(std::all_of(mix.begin(), mix.end(), [](const auto& n) { return n.starts_with("mtp."); }));

  for (const auto* dir : {&own_shard, &mixed, &per_expert}) {
    ModelWeights w = load_checkpoint(dir->path());
    ASSERT_TRUE(w.mtp.has_value()) << dir->path();
    EXPECT_EQ(mtp_logits(w, kPrompt), expected) << dir->path();
  }
}

// An FP8 checkpoint's MTP layer (128x128 block scales, router and shared-expert gate kept in BF16 as the
// releases do) computes what its dequantized float32 twin computes.
TEST(MtpCheckpoint, Fp8MtpLayerMatchesItsDequantizedTwin) {
  const std::string src = kFixtures + "tiny-moe-mtp";
  auto quantizable = [](const TensorWrite& t) {
    // Fused gate_up stays BF16: its 32-row halves cannot be cut out of 128-row scale blocks.
    return t.name.starts_with("mtp.") && t.shape.size() >= 2 &&
           t.name.find("mlp.gate.") == std::string::npos &&
           t.name.find("gate_up_proj") == std::string::npos &&
           t.name.find("shared_expert_gate") == std::string::npos;
  };
  auto widen = [](const TensorWrite& t) {
    std::vector<uint8_t> raw(t.nbytes());
    t.fill(raw.data());
    std::vector<float> f(raw.size() / 2);
    for (size_t i = 0; i < f.size(); ++i) {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      f[i] = bf16_to_f32(b);
    }
    return f;
  };
  TempDir fp8, twin;
  auto fp8_config = [](nlohmann::json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  };
  std::map<std::string, std::vector<float>> dequantized;  // what each FP8 tensor stands for
  rewrite_checkpoint(
      src, fp8.path(),
      [&](std::vector<TensorWrite>& tensors) {
        std::vector<TensorWrite> scales;
        for (auto& t : tensors) {
          if (!quantizable(t)) continue;
          // Every MTP matrix of this model has at most 128 columns: one scale per band of 128 rows of a
          // slice.
          const int64_t cols = t.shape.back(), slice_rows = t.shape[t.shape.size() - 2];
          const int64_t slices = t.shape.size() == 3 ? t.shape[0] : 1, bands = (slice_rows + 127) / 128;
          auto f = widen(t);
          std::vector<uint8_t> q(f.size());
          std::vector<float> s(static_cast<size_t>(slices * bands));
          for (int64_t e = 0; e < slices; ++e)
            for (int64_t band = 0; band < bands; ++band) {
              const int64_t first = e * slice_rows + band * 128,
                            rows = std::min<int64_t>(128, slice_rows - band * 128);
              quantize_fp8_band(f.data() + first * cols, rows, cols, 128, q.data() + first * cols,
                                &s[size_t(e * bands + band)]);
              for (int64_t i = first * cols; i < (first + rows) * cols; ++i)
                f[size_t(i)] = fp8_e4m3_to_f32(q[size_t(i)]) * s[size_t(e * bands + band)];
            }
          dequantized[t.name] = f;
          std::vector<int64_t> scale_shape = t.shape;
          scale_shape[scale_shape.size() - 2] = bands;
          scale_shape.back() = 1;
          scales.push_back(TensorWrite::copy_of(t.name + "_scale_inv", DType::F32, scale_shape,
                                                {reinterpret_cast<const uint8_t*>(s.data()), s.size() * 4}));
          t = TensorWrite::copy_of(t.name, DType::F8_E4M3, t.shape, q);
        }
        tensors.insert(tensors.end(), scales.begin(), scales.end());
      },
      fp8_config);
  Checkpoint quantized = open_checkpoint(fp8.path());
  ASSERT_TRUE(quantized.weights.mtp.has_value()) << quantized.mtp_problem;
  EXPECT_EQ(quantized.weights.mtp->fc.dtype, DType::F8_E4M3);
  EXPECT_EQ(quantized.weights.mtp->layer.moe.experts[3].down.dtype, DType::F8_E4M3);
  EXPECT_EQ(quantized.weights.mtp->layer.moe.router.dtype, DType::BF16);

  // The twin stores every quantized MTP matrix as the float32 values the FP8 one stands for.
  rewrite_checkpoint(src, twin.path(), [&](std::vector<TensorWrite>& tensors) {
    for (auto& t : tensors) {
      auto it = dequantized.find(t.name);
      if (it == dequantized.end()) continue;
      t = TensorWrite::copy_of(t.name, DType::F32, t.shape,
                               {reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size() * 4});
    }
  });
  auto a = mtp_logits(quantized.weights, kPrompt), b = mtp_logits(load_checkpoint(twin.path()), kPrompt);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace moeserve
