// The engine with images (docs/vision.md) on a random model of the demo's shape: the vision tower's work is
// spread over steps that keep decoding the other sequences; and speculative decoding (MTP) with images in
// the prompt: the MTP layer's row p takes what the model took at p + 1 (the image token and its image
// feature, never the prefix cache's key) and the model's M-RoPE position of p, through chunks that split the
// images and through decode and verify steps after them; and the output is exactly plain decoding's, with
// the model's own (random) MTP layer and with oracle drafts that are accepted at every depth.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/model_runner.h"
#include "forwarding_runner.h"
#include "model/init_model.h"
#include "model/qwen35.h"
#include "requests.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/tower.h"

namespace moeserve {
namespace {

using engine_test::greedy;
using engine_test::random_prompt;

const std::string kImages = "tests/fixtures/models/tiny-moe-vl-image/";

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The demo's shape: the tiny preset with an MTP layer, a random tower (2 blocks of 64) and M-RoPE sections.
struct VisionMtpModel {
  VisionMtpModel() {
    ModelConfig config = preset_config("tiny");
    config.mtp_num_layers = 1;
    add_mrope_sections(config);
    weights = make_dummy_weights(config, 11);
    DummyVision dummy = make_dummy_vision(config, 11, {}, default_vision_shape(config));
    vision_config = *VisionConfig::from_json(dummy.config);
    vision = load_vision_weights(dummy.tensors, vision_config);
  }
  ModelWeights weights;
  VisionConfig vision_config;
  VisionWeights vision;
};

// What the model and the MTP layer were fed, by absolute position: the token, the image feature (if any) and
// the three M-RoPE positions.
struct Recording {
  struct Row {
    int32_t token = 0;
    std::vector<float> feature;  // empty: the token's embedding
    std::array<int64_t, 3> position{};
  };
  std::map<int64_t, Row> model_rows, mtp_rows;
  int64_t mtp_feature_rows = 0;
};

// The real runner, recording into `recording` (when given; the test owns it, the engine the runner). With
// `continuation` set, drafts are replaced by the known next tokens (an oracle: every draft accepted, so
// verify steps keep 1..k+1 rows).
class WatchedRunner : public engine_test::ForwardingRunner {
 public:
  using Row = Recording::Row;
  WatchedRunner(const VisionMtpModel& m, std::vector<int32_t> continuation, Recording* recording = nullptr)
      : ForwardingRunner(make_qwen35_runner(m.weights, nullptr, &m.vision)),
        continuation_(std::move(continuation)),
        recording_(recording) {}

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    if (recording_)
      for (const SequenceStep& s : batch) record(s, recording_->model_rows);
    return ForwardingRunner::forward(batch, kv, state);
  }
  std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch, std::span<const int64_t> hidden_rows,
                                 bool from_forward, KvCache& kv) override {
    for (const SequenceStep& s : batch) {
      if (!recording_) break;
      record(s, recording_->mtp_rows);
      recording_->mtp_feature_rows += int64_t(s.feature_rows.size());
    }
    std::vector<int32_t> drafts = ForwardingRunner::mtp_draft(batch, hidden_rows, from_forward, kv);
    for (size_t i = 0; i < batch.size(); ++i) {
      // The step's last row: token t_{p+1} at position p drafts t_{p+2}.
      const size_t next = size_t(batch[i].start_pos + int64_t(batch[i].tokens.size())) + 1;
      if (next < continuation_.size()) drafts[i] = continuation_[next];
    }
    return drafts;
  }

 private:
  static void record(const SequenceStep& s, std::map<int64_t, Row>& rows) {
    const int64_t T = int64_t(s.tokens.size()),
                  H = int64_t(s.features.size()) / std::max<int64_t>(int64_t(s.feature_rows.size()), 1);
    for (int64_t t = 0; t < T; ++t) {
      Row& row = rows[s.start_pos + t];
      row = {};
      row.token = s.tokens[size_t(t)];
      for (int axis = 0; axis < 3; ++axis)
        row.position[size_t(axis)] = s.rope_positions.empty() ? s.start_pos + t + s.rope_delta
                                                              : s.rope_positions[size_t(axis * T + t)];
    }
    for (size_t i = 0; i < s.feature_rows.size(); ++i)
      rows[s.start_pos + s.feature_rows[i]].feature.assign(s.features.begin() + int64_t(i) * H,
                                                           s.features.begin() + int64_t(i + 1) * H);
  }
  std::vector<int32_t> continuation_;
  Recording* recording_;
};

EngineOptions options(int spec_steps) {
  EngineOptions o;
  o.page_size = 16;
  o.cache_memory_bytes = 16 << 20;
  o.max_running_requests = 4;
  o.chunked_prefill_size = 32;  // splits both images' runs (70 and 72 tokens)
  o.max_num_batched_tokens = 64;
  o.max_model_len = 512;
  o.speculative_num_steps = spec_steps;
  o.speculative_adaptive = false;
  return o;
}

// Two text runs around the fixture's two images (image1: 100x72, 70 tokens; image0: 72 tokens), as the
// server lays a prompt out: each image a run of image tokens.
struct ImagePrompt {
  std::vector<int32_t> prompt;
  std::shared_ptr<PromptImages> images;
};

ImagePrompt image_prompt(const VisionMtpModel& m, uint32_t seed) {
  std::mt19937 rng(seed);
  const int vocab = int(m.weights.config.vocab_size) - 8;  // below the vision ids at the vocabulary's end
  ImagePrompt p;
  p.images = std::make_shared<PromptImages>();
  p.images->image_token = int32_t(m.vision_config.image_token_id);
  p.prompt = random_prompt(rng, 5, vocab);
  for (int k : {1, 0}) {
    PromptImage& image = p.images->images.emplace_back();
    image.patches = preprocess_image(decode_image(file_bytes(kImages + "image" + std::to_string(k) + ".png")),
                                     ImageProcessorConfig{});
    image.hash = {uint64_t(k) + 1, seed};
    p.prompt.insert(p.prompt.end(), size_t(image.patches.tokens(2)), p.images->image_token);
    const auto text = random_prompt(rng, 7, vocab);
    p.prompt.insert(p.prompt.end(), text.begin(), text.end());
  }
  return p;
}

// One request through an EngineCore, its invariants checked after every step: its output tokens.
std::vector<int32_t> run(std::unique_ptr<ModelRunner> model, const EngineOptions& o, const ImagePrompt& p,
                         int max_tokens, EngineStats* stats = nullptr) {
  EngineCore core(std::move(model), o);
  auto stream = std::make_shared<OutputStream>();
  GenerateRequest r{"r", p.prompt, greedy(max_tokens), 0, stream->sink(), 0, p.images};
  core.validate(r);
  core.add(std::move(r));
  for (int step = 0; step < 2000 && !core.idle(); ++step) {
    core.step();
    core.deliver();
    core.check_invariants();
  }
  EXPECT_TRUE(core.idle());
  if (stats) *stats = core.stats();
  return stream->collect().tokens;
}

// A burst of images does not stall decoding: with a step budget of one image's patches (280), a request
// with six images is encoded one image a step, and a request already decoding gets a token in every one of
// those steps.
TEST(VisionScheduling, ABurstOfImagesIsEncodedOverStepsThatKeepDecoding) {
  VisionMtpModel m;
  EngineOptions o = options(0);
  o.vision_patches_per_step = 280;
  EngineCore core(make_qwen35_runner(m.weights, nullptr, &m.vision), o);
  auto text = std::make_shared<OutputStream>(), images = std::make_shared<OutputStream>();
  std::mt19937 rng(9);
  GenerateRequest decoding{
      .id = "text", .prompt = random_prompt(rng, 12, 400), .params = greedy(60), .on_output = text->sink()};
  core.add(std::move(decoding));
  auto tokens_of = [](OutputStream& s) {
    size_t n = 0;
    while (auto out = s.try_next()) n += out->tokens.size();
    return n;
  };
  for (int i = 0; i < 3; ++i) core.step(), core.deliver();  // prefill, then decoding
  ASSERT_GT(tokens_of(*text), 0u);

  ImagePrompt p = image_prompt(m, 4);
  const PromptImage one = p.images->images[0];  // image1: 280 patches, 70 tokens
  p.images->images.clear();
  p.prompt.resize(5);
  for (uint64_t k = 0; k < 6; ++k) {
    PromptImage& image = p.images->images.emplace_back(one);
    image.hash = {k + 100, 7};  // six different pictures to the caches
    p.prompt.insert(p.prompt.end(), 70, p.images->image_token);
    p.prompt.push_back(3);  // a run of image tokens is one image: text between them
  }
  GenerateRequest r{"images", p.prompt, greedy(4), 0, images->sink(), 0, p.images};
  core.validate(r);
  core.add(std::move(r));
  int encoding_steps = 0;
  for (uint64_t encoded = 0; encoded < 6; ++encoding_steps) {
    core.step();
    core.deliver();
    core.check_invariants();
    const uint64_t now = core.stats().images_encoded;
    EXPECT_EQ(now, encoded + 1) << "one image's patches a step";
    encoded = now;
    EXPECT_EQ(tokens_of(*text), 1u) << "the decoding request got its token in step " << encoding_steps;
  }
  EXPECT_EQ(encoding_steps, 6);
  for (int step = 0; step < 500 && !core.idle(); ++step) core.step(), core.deliver();
  EXPECT_EQ(images->collect().tokens.size(), 4u);
}

// Inside the MTP layer: a feature row replaces that row's embedding, and only that row's. Row 1 given token
// a and the embedding of b as its feature gives b's logits bit for bit; another feature moves row 1 only.
TEST(SpeculativeWithImages, TheMtpLayerTakesAFeatureRowInPlaceOfItsEmbedding) {
  VisionMtpModel m;
  auto backend = make_cpu_backend();
  Qwen35Model model(m.weights, *backend);
  model.prepare_mtp();
  KvCache kv(model.mtp_kv_cache_spec(16, 1));
  const int64_t H = m.weights.config.hidden_size, V = m.weights.config.vocab_size;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> hidden(size_t(2 * H));
  for (float& x : hidden) x = normal(rng);
  const int32_t a = 17, b = 42, pages[] = {0};
  std::vector<float> b_embedding(static_cast<size_t>(H));
  backend->embed(std::span(&b, 1), m.weights.embed, b_embedding.data());
  auto logits = [&](std::vector<int32_t> tokens, std::vector<int32_t> rows, const std::vector<float>& f) {
    SequenceStep s;
    s.tokens = tokens;
    s.pages = pages;
    s.all_logits = true;
    s.feature_rows = rows;
    s.features = f;
    return model.mtp_forward({&s, 1}, hidden, kv).logits;
  };
  const std::vector<float> plain = logits({a, b}, {}, {});
  ASSERT_EQ(plain.size(), size_t(2 * V));
  EXPECT_EQ(logits({a, a}, {1}, b_embedding), plain);
  std::vector<float> other = b_embedding;
  for (float& x : other) x = -x;
  const std::vector<float> moved = logits({a, b}, {1}, other);
  EXPECT_TRUE(std::equal(moved.begin(), moved.begin() + V, plain.begin())) << "row 0 is causal to row 1";
  EXPECT_FALSE(std::equal(moved.begin() + V, moved.end(), plain.begin() + V)) << "row 1 took the feature";
}

TEST(SpeculativeWithImages, MtpRowsTakeTheModelsTokensFeaturesAndPositions) {
  VisionMtpModel m;
  const ImagePrompt p = image_prompt(m, 5);
  const std::vector<int32_t> plain =
      run(make_qwen35_runner(m.weights, nullptr, &m.vision), options(0), p, 24);
  Recording rec;
  auto watched = std::make_unique<WatchedRunner>(m, engine_test::concat(p.prompt, plain), &rec);
  EXPECT_EQ(run(std::move(watched), options(3), p, 24), plain);
  const std::vector<int32_t> sequence = engine_test::concat(p.prompt, plain);

  // Every MTP row p: the token and feature the model took at p + 1, the model's position of p.
  int64_t image_rows = 0;
  for (const auto& [pos, row] : rec.mtp_rows) {
    SCOPED_TRACE("MTP row at position " + std::to_string(pos));
    ASSERT_TRUE(rec.model_rows.count(pos)) << "the model ran every position the MTP layer follows";
    EXPECT_EQ(row.position, rec.model_rows.at(pos).position);
    if (!rec.model_rows.count(pos + 1)) continue;  // a draft's row: verified later
    const auto& next = rec.model_rows.at(pos + 1);
    if (size_t(pos + 1) < sequence.size() && size_t(pos + 1) < p.prompt.size()) {
      EXPECT_EQ(row.token, sequence[size_t(pos + 1)]);
    }
    EXPECT_EQ(row.token, next.token);
    ASSERT_EQ(row.feature.size(), next.feature.size());
    if (!row.feature.empty()) {
      ++image_rows;
      EXPECT_EQ(std::memcmp(row.feature.data(), next.feature.data(), row.feature.size() * sizeof(float)), 0);
    }
  }
  EXPECT_EQ(image_rows, 70 + 72) << "every image row's feature, once";
  EXPECT_EQ(rec.mtp_feature_rows, 70 + 72);
  for (const auto& [pos, row] : rec.model_rows) EXPECT_GE(row.token, 0) << "never a cache key";
  for (const auto& [pos, row] : rec.mtp_rows) EXPECT_GE(row.token, 0) << "never a cache key";
}

TEST(SpeculativeWithImages, GreedyOutputEqualsPlainDecodingWithTheMtpLayerAndWithOracleDrafts) {
  VisionMtpModel m;
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const ImagePrompt p = image_prompt(m, seed);
    const auto plain = run(make_qwen35_runner(m.weights, nullptr, &m.vision), options(0), p, 20);
    for (int k : {1, 3}) {
      SCOPED_TRACE("k = " + std::to_string(k));
      EngineStats stats;
      EXPECT_EQ(run(make_qwen35_runner(m.weights, nullptr, &m.vision), options(k), p, 20, &stats), plain);
      EXPECT_GT(stats.spec_drafts, 0u);
      auto oracle = std::make_unique<WatchedRunner>(m, engine_test::concat(p.prompt, plain));
      EXPECT_EQ(run(std::move(oracle), options(k), p, 20, &stats), plain);
      EXPECT_GT(stats.spec_accepted_tokens, stats.spec_draft_tokens / 2);
    }
  }
}

}  // namespace
}  // namespace moeserve
