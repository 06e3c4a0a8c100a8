// End to end with images (docs/vision.md): the real `moeserve serve` binary on the tiny-moe-vl-image fixture
// (a vision tower, no tokenizer: token-id prompts with SGLang's image_data), checked against the Hugging Face
// reference's greedy tokens; the prefix cache keyed by image content; bad images, a stalled image URL and the
// image flags, each a clear 4xx with the server still up.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "fake_backend.h"
#include "http_connection.h"
#include "loopback.h"
#include "reference_ids.h"
#include "run_process.h"
#include "serve_process.h"
#include "test_images.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;
using testing_http::Connection;

const char* kVisionModel = "tests/fixtures/models/tiny-moe-vl-image";
constexpr int32_t kImageToken = 507;  // reference.json: special_token_ids.image

std::vector<int32_t> reference_ids(const std::string& name) {
  return server::reference_ids(kVisionModel, name);
}

// The prompt as a client sends it: each image's run of image tokens is one placeholder.
std::vector<int32_t> collapse_image_runs(const std::vector<int32_t>& ids) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != kImageToken || i == 0 || ids[i - 1] != kImageToken) out.push_back(ids[i]);
  return out;
}

using testing_images::base64;
using testing_images::png_data_url;

std::string fixture_image(int k) {
  std::ifstream in(std::string(kVisionModel) + "/image" + std::to_string(k) + ".png", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A PNG of random pixels.
std::string random_png(int width, int height, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> pixels(size_t(width) * height * 3);
  for (auto& p : pixels) p = uint8_t(rng());
  return testing_images::encode_png(pixels.data(), width, height, 3);
}

json completion(uint16_t port, const std::vector<int32_t>& prompt, const std::vector<std::string>& images,
                int max_tokens, int expect_status = 200) {
  json body = {{"prompt", prompt}, {"image_data", images}, {"max_tokens", max_tokens},
               {"temperature", 0}, {"ignore_eos", true},   {"return_token_ids", true}};
  auto r = Connection(port).roundtrip("POST", "/v1/completions", body.dump());
  EXPECT_EQ(r.status, expect_status) << r.body;
  return json::parse(r.body, nullptr, false);
}

double metric(uint16_t port, const std::string& name) {
  std::string body = Connection(port).roundtrip("GET", "/metrics").body;
  for (size_t at = 0; (at = body.find(name, at)) != std::string::npos; at += name.size()) {
    if (at > 0 && body[at - 1] != '\n') continue;
    size_t eol = body.find('\n', at);
    std::string line = body.substr(at, eol - at);
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::unique_ptr<ServeProcess> start(std::vector<std::string> args) {
  auto p = std::make_unique<ServeProcess>(std::move(args));
  EXPECT_TRUE(p->wait_ready()) << p->output();
  return p;
}

// A loopback peer for image URLs (tests/peers' FakeBackend): sends `reply` as it is to each request (nothing:
// it stalls), then holds the connection open until the peer is destroyed.
class ImagePeer {
 public:
  explicit ImagePeer(std::string reply)
      : backend_([this, reply = std::move(reply)](const peers::HttpRequest&, peers::BackendConnection& c) {
          if (!reply.empty()) c.send_raw(reply);
          released_.wait(120'000);  // a hang guard: the destructor opens it
          c.close_after();
        }) {}
  ~ImagePeer() { released_.open(); }
  std::string url() const { return backend_.url() + "/image.png"; }

 private:
  peers::Gate released_;  // declared first: it outlives the backend's handlers
  peers::FakeBackend backend_;
};

// Chunks of 32 tokens split both images' runs (72 and 70 tokens): the chunks take their own rows' features.
TEST(ServeVision, GreedyCompletionWithImagesEqualsTheReference) {
  auto p = start({"--model", kVisionModel, "--chunked-prefill-size", "32"});
  const std::vector<std::string> images = {png_data_url(fixture_image(0)), png_data_url(fixture_image(1))};
  struct Case {
    const char* prompt;
    const char* gen;
    std::vector<std::string> images;
  } cases[] = {{"prompt0", "gen0", {images[1]}}, {"prompt1", "gen1", images}};
  for (const Case& c : cases) {
    auto full = reference_ids(std::string(c.prompt) + ".input_ids");
    auto expected = reference_ids(std::string(c.gen) + ".output_ids");
    json r = completion(p->port(), collapse_image_runs(full), c.images, int(expected.size()));
    EXPECT_EQ(r["choices"][0]["token_ids"], json(expected)) << c.gen;
    EXPECT_EQ(r["usage"]["prompt_tokens"], full.size()) << "placeholders expanded to the images' tokens";
  }
  // image1 is in both prompts: the second time its features come from the encoder cache.
  EXPECT_EQ(metric(p->port(), "moeserve:images_total"), 3);
  EXPECT_EQ(metric(p->port(), "moeserve:image_encoded_total"), 2);
  EXPECT_EQ(metric(p->port(), "moeserve:image_encoder_cache_hits_total"), 1);
  EXPECT_EQ(metric(p->port(), "moeserve:image_patches_encoded_total"), 280 + 288);
  EXPECT_GT(metric(p->port(), "moeserve:image_encode_seconds_total"), 0);
}

TEST(ServeVision, TheSameImageHitsThePrefixCacheADifferentOneOfTheSameSizeNever) {
  auto p = start({"--model", kVisionModel});
  // prompt0: 4 text tokens, image 1's 70 tokens (100x72 pixels), 12 text tokens.
  const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));
  const std::string a = png_data_url(random_png(100, 72, 1)), b = png_data_url(random_png(100, 72, 2));
  auto cached = [](const json& r) {
    return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  json first = completion(p->port(), prompt, {a}, 4);
  EXPECT_EQ(first["usage"]["prompt_tokens"], 86);
  json other = completion(p->port(), prompt, {b}, 4);
  EXPECT_EQ(other["usage"]["prompt_tokens"], 86);
  EXPECT_LE(cached(other), 4) << "a different image of the same size must not reuse the first one's rows";
  json again = completion(p->port(), prompt, {a}, 4);
  EXPECT_GT(cached(again), 74) << "the same image again is served from the cache past its rows";
  EXPECT_EQ(again["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
}

// The encoder cache: an image seen before skips the tower where the prefix cache cannot help (echo +
// logprobs recomputes every prompt row; another text before the image parts from the cached path at row 0),
// and the answer is the same bits as with the cache off: every prompt logprob and the greedy tokens. A
// different image of the same size never hits.
TEST(ServeVision, TheEncoderCacheSkipsTheTowerForAnImageSeenAgainAndChangesNoBit) {
  auto on = start({"--model", kVisionModel});
  auto off = start({"--model", kVisionModel, "--mm-encoder-cache-mb", "0"});
  const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));  // the image at row 4
  auto other_text = prompt;
  other_text[0] = other_text[0] == 17 ? 18 : 17;
  const std::string a = png_data_url(fixture_image(1)), b = png_data_url(random_png(100, 72, 3));
  auto answer = [](uint16_t port, const std::vector<int32_t>& ids, const std::string& image) {
    json body = {{"prompt", ids},    {"image_data", {image}},   {"max_tokens", 6},
                 {"temperature", 0}, {"ignore_eos", true},      {"echo", true},
                 {"logprobs", 1},    {"return_token_ids", true}};
    auto r = Connection(port).roundtrip("POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    json choice = json::parse(r.body)["choices"][0];
    EXPECT_GT(choice["logprobs"]["token_logprobs"].size(), 86u);
    return json{{"ids", choice["token_ids"]}, {"logprobs", choice["logprobs"]["token_logprobs"]}};
  };
  const json first = answer(on->port(), prompt, a);
  const auto gen0 = reference_ids("gen0.output_ids");
  ASSERT_GE(gen0.size(), 6u);
  EXPECT_EQ(first["ids"], json(std::vector<int32_t>(gen0.begin(), gen0.begin() + 6))) << "the reference's";
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoder_cache_misses_total"), 1);
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoder_cache_hits_total"), 0);
  EXPECT_GT(metric(on->port(), "moeserve:image_encoder_cache_bytes"), 0);

  EXPECT_EQ(answer(on->port(), prompt, a), first) << "the same prompt again, every row recomputed";
  const json moved = answer(on->port(), other_text, a);
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoder_cache_hits_total"), 2);
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoded_total"), 1) << "the tower ran once for image a";
  EXPECT_EQ(moved, answer(off->port(), other_text, a)) << "cached features change no bit";

  const json different = answer(on->port(), prompt, b);
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoder_cache_misses_total"), 2) << "a different image";
  EXPECT_EQ(metric(on->port(), "moeserve:image_encoder_cache_hits_total"), 2);
  EXPECT_EQ(different, answer(off->port(), prompt, b));
  EXPECT_EQ(metric(off->port(), "moeserve:image_encoder_cache_hits_total"), 0);
  EXPECT_EQ(metric(off->port(), "moeserve:image_encoded_total"), 2);
}

TEST(ServeVision, BadImagesAndUnanswerableUrlsAreClear400sAndTheServerStaysUp) {
  auto p = start(
      {"--model", kVisionModel, "--image-fetch-timeout", "1", "--limit-mm-per-prompt", R"({"image": 2})"});
  const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));
  auto message = [](const json& r) { return r["error"]["message"].get<std::string>(); };

  json r = completion(p->port(), prompt, {"data:image/png;base64,AAAAAAAA"}, 1, 400);
  EXPECT_NE(message(r).find("image_data[0]"), std::string::npos) << r.dump();
  r = completion(p->port(), prompt, {"data:text/plain;base64," + base64(fixture_image(1))}, 1, 400);
  EXPECT_NE(message(r).find("image"), std::string::npos) << r.dump();
  r = completion(p->port(), prompt, {"ftp://example.com/a.png"}, 1, 400);
  r = completion(p->port(), prompt, {png_data_url(fixture_image(1)), png_data_url(fixture_image(1))}, 1, 400);
  EXPECT_NE(message(r).find("placeholders"), std::string::npos) << r.dump();
  std::vector<std::string> three(3, png_data_url(fixture_image(1)));
  r = completion(p->port(), prompt, three, 1, 400);
  EXPECT_NE(message(r).find("at most 2"), std::string::npos) << r.dump();
  {
    ImagePeer stalls("");
    r = completion(p->port(), prompt, {stalls.url()}, 1, 400);
    EXPECT_NE(message(r).find("image_data[0]"), std::string::npos) << r.dump();
  }
  {
    ImagePeer huge("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 104857600\r\n\r\n" +
                   std::string(65536, 'x'));
    r = completion(p->port(), prompt, {huge.url()}, 1, 400);
    EXPECT_NE(message(r).find("image_data[0]"), std::string::npos) << r.dump();
  }
  {
    ImagePeer png("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: " +
                  std::to_string(fixture_image(1).size()) + "\r\nConnection: close\r\n\r\n" +
                  fixture_image(1));
    auto expected = reference_ids("gen0.output_ids");
    r = completion(p->port(), prompt, {png.url()}, int(expected.size()));
    EXPECT_EQ(r["choices"][0]["token_ids"], json(expected)) << "a fetched image is the same as inline";
  }
  EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 200);
}

TEST(ServeVision, LanguageModelOnlyAndFetchingOffRefuseWhatTheyTurnOff) {
  {
    auto p = start({"--model", kVisionModel, "--language-model-only"});
    const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));
    json r = completion(p->port(), prompt, {png_data_url(fixture_image(1))}, 1, 400);
    EXPECT_NE(r["error"]["message"].get<std::string>().find("--language-model-only"), std::string::npos)
        << r.dump();
    // Text still works.
    auto text = reference_ids("prompt0.input_ids");
    text.resize(4);
    completion(p->port(), text, {}, 2);
  }
  {
    auto p = start({"--model", kVisionModel, "--disable-image-fetch"});
    json r = completion(p->port(), collapse_image_runs(reference_ids("prompt0.input_ids")),
                        {"http://127.0.0.1:9/image.png"}, 1, 400);
    EXPECT_NE(r["error"]["message"].get<std::string>().find("fetch"), std::string::npos) << r.dump();
  }
}

// A PNG whose header declares width x height with no pixel data after it (a decoder that trusted the
// header would allocate for it).
std::string png_header_only(uint32_t width, uint32_t height) {
  auto crc32 = [](const std::string& bytes) {
    uint32_t crc = 0xFFFFFFFF;
    for (unsigned char b : bytes) {
      crc ^= b;
      for (int k = 0; k < 8; ++k) crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    return ~crc;
  };
  auto be32 = [](uint32_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
  auto chunk = [&](const std::string& type, const std::string& data) {
    return be32(uint32_t(data.size())) + type + data + be32(crc32(type + data));
  };
  std::string ihdr = be32(width) + be32(height) + std::string{8, 2, 0, 0, 0};  // 8-bit RGB
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IEND", "");
}

// A decompression bomb: a valid gray PNG of zeros, a few kilobytes for megapixels.
std::string zeros_png(int width, int height) {
  std::vector<uint8_t> pixels(size_t(width) * height, 0);
  return testing_images::encode_png(pixels.data(), width, height, 1);
}

// Memory safety: an image is refused from its header before a pixel is decoded when it declares more
// pixels than --max-image-pixels (30000x30000 with no data; a valid bomb), and a request's images are
// refused at the one that takes the request past its patch budget (--max-image-patches-per-request, or the
// context); each a 400 naming the image, no image counted, the server up and serving images after.
TEST(ServeVision, HugeImagesAndManyImagesAreRefusedBeforeDecodingAndTheServerStaysUp) {
  auto p = start(
      {"--model", kVisionModel, "--max-image-pixels", "1000000", "--max-image-patches-per-request", "500"});
  const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));
  auto message = [](const json& r) { return r["error"]["message"].get<std::string>(); };

  json r = completion(p->port(), prompt, {png_data_url(png_header_only(30000, 30000))}, 1, 400);
  EXPECT_NE(message(r).find("image_data[0]"), std::string::npos) << r.dump();
  EXPECT_NE(message(r).find("30000x30000 pixels, more than the limit of 1000000"), std::string::npos)
      << r.dump();
  const std::string bomb = zeros_png(4000, 4000);
  EXPECT_LT(bomb.size(), size_t(1) << 20);  // 16 megapixels in under a megabyte
  r = completion(p->port(), prompt, {png_data_url(bomb)}, 1, 400);
  EXPECT_NE(message(r).find("4000x4000 pixels, more than the limit"), std::string::npos) << r.dump();

  // image1 is 280 patches: the second of many takes the request past 500, before it is decoded.
  std::vector<std::string> many(40, png_data_url(fixture_image(1)));
  std::vector<int32_t> placeholders = prompt;
  placeholders.insert(placeholders.end(), 39, kImageToken);
  r = completion(p->port(), placeholders, many, 1, 400);
  EXPECT_NE(message(r).find("image_data[1]"), std::string::npos) << r.dump();
  EXPECT_NE(message(r).find("560 patches, over the limit of 500 per request"), std::string::npos) << r.dump();
  EXPECT_EQ(metric(p->port(), "moeserve:images_total"), 0);

  auto expected = reference_ids("gen0.output_ids");
  r = completion(p->port(), prompt, {png_data_url(fixture_image(1))}, int(expected.size()));
  EXPECT_EQ(r["choices"][0]["token_ids"], json(expected));
  EXPECT_EQ(metric(p->port(), "moeserve:images_total"), 1);

  // The context holds 64 tokens, 256 patches: image1's 280 do not fit.
  auto small = start({"--model", kVisionModel, "--max-model-len", "64"});
  r = completion(small->port(), prompt, {png_data_url(fixture_image(1))}, 1, 400);
  EXPECT_NE(message(r).find("over the 256 the 64-token context holds"), std::string::npos) << r.dump();
  EXPECT_EQ(Connection(small->port()).roundtrip("GET", "/health").status, 200);
}

// --load-format dummy builds a random tower: of the preset's shape (the tiny preset's is the fixture's 2
// blocks of 64; 35b-a3b's the release's 27 blocks of 1152, tests/vision/init_model_test.cpp), or of the
// checkpoint's vision_config with --model DIR. So a dummy-weights server takes images: a picture of 70 image
// tokens adds them to the prompt, and the tower encodes it.
TEST(ServeVision, DummyWeightsServeImagesThroughARandomTower) {
  {
    // No tokenizer: the vision tokens are the vocabulary's last ids, as init-model --vision writes them.
    auto p = start({"--load-format", "dummy", "--preset", "tiny", "--cache-memory-gb", "0.0625"});
    EXPECT_NE(p->output().find("vision tower: 2 blocks of 64"), std::string::npos) << p->output();
    json r = completion(p->port(), {1, 504, kImageToken, 505, 9, 10}, {png_data_url(fixture_image(1))}, 2);
    EXPECT_EQ(r["usage"]["prompt_tokens"], 5 + 70) << r.dump();
    EXPECT_EQ(metric(p->port(), "moeserve:image_encoded_total"), 1);
  }
  {
    auto p = start({"--load-format", "dummy", "--model", kVisionModel, "--cache-memory-gb", "0.0625"});
    EXPECT_NE(p->output().find("vision tower: 2 blocks of 64"), std::string::npos) << p->output();
    const auto prompt = reference_ids("prompt0.input_ids");
    json r = completion(p->port(), collapse_image_runs(prompt), {png_data_url(fixture_image(1))}, 2);
    EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size()) << r.dump();
    EXPECT_EQ(metric(p->port(), "moeserve:image_encoded_total"), 1);
  }
}

// vLLM's --mm-processor-kwargs bounds the resize: image1 (100x72, 70 tokens at the fixture's 65,536
// min_pixels) becomes 128x160 at 16,384 (smart_resize: 64x96 is below it, so both sides scale up by
// sqrt(16384 / 7200) and round up to multiples of 32): 20 tokens. A key it does not take stops the start.
TEST(ServeVision, MmProcessorKwargsBoundTheResize) {
  auto p = start(
      {"--model", kVisionModel, "--mm-processor-kwargs", R"({"min_pixels": 16384, "max_pixels": 16384})"});
  const auto prompt = reference_ids("prompt0.input_ids");
  json r = completion(p->port(), collapse_image_runs(prompt), {png_data_url(fixture_image(1))}, 1);
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size() - 70 + 20) << r.dump();

  ServeProcess bad({"--model", kVisionModel, "--mm-processor-kwargs", R"({"do_resize": false})"});
  EXPECT_FALSE(bad.wait_ready(std::chrono::seconds(60)));
  EXPECT_NE(bad.output().find("--mm-processor-kwargs: do_resize is not taken"), std::string::npos)
      << bad.output();
}

// vLLM's per-request mm_processor_kwargs: min_pixels / max_pixels within the server's bounds (here [16,384,
// 16,777,216] from --mm-processor-kwargs) set this request's resize, and the token count follows
// smart_resize: a 640x480 picture is 480x640 (30x40 patches, 300 tokens) as the server resizes it; at
// max_pixels 65,536 it shrinks by beta = sqrt(307200 / 65536) and floors to multiples of 32: 192x288, 54
// tokens; at 100,000 256x352, 88 tokens. image1 (100x72) is 20 tokens at the server's min_pixels and 70 at
// a request's 65,536. Bounds outside the server's, unknown keys and min over max are 400s naming the key; the
// same picture at another grid never reuses the first one's cached rows.
TEST(ServeVision, RequestMmProcessorKwargsResizeWithinTheServersBounds) {
  auto p = start({"--model", kVisionModel, "--mm-processor-kwargs", R"({"min_pixels": 16384})"});
  const auto prompt = collapse_image_runs(reference_ids("prompt0.input_ids"));  // 16 text tokens + 1
  auto send = [&](const std::string& image, const json& kwargs, int status = 200) {
    json body = {{"prompt", prompt}, {"image_data", {image}}, {"max_tokens", 2}, {"temperature", 0}};
    if (!kwargs.is_null()) body["mm_processor_kwargs"] = kwargs;
    auto r = Connection(p->port()).roundtrip("POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, status) << r.body;
    return json::parse(r.body, nullptr, false);
  };
  auto tokens = [](const json& r) { return r["usage"]["prompt_tokens"].get<int64_t>() - 16; };
  const std::string big = png_data_url(random_png(640, 480, 4)), small = png_data_url(fixture_image(1));
  EXPECT_EQ(tokens(send(big, nullptr)), 300);
  EXPECT_EQ(tokens(send(big, {{"max_pixels", 65536}})), 54);
  const json bounded = send(big, {{"max_pixels", 100000}});
  EXPECT_EQ(tokens(bounded), 88);
  EXPECT_LE(bounded["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 4)
      << "the same picture at another grid parts from the cached rows at its first";
  EXPECT_EQ(tokens(send(small, nullptr)), 20);
  EXPECT_EQ(tokens(send(small, {{"min_pixels", 65536}})), 70);

  auto message = [](const json& r) { return r["error"]["message"].get<std::string>(); };
  json r = send(big, {{"max_pixels", 20000000}}, 400);
  EXPECT_NE(message(r).find("mm_processor_kwargs.max_pixels"), std::string::npos) << r.dump();
  EXPECT_NE(message(r).find("[16384, 16777216]"), std::string::npos) << r.dump();
  r = send(big, {{"min_pixels", 1000}}, 400);
  EXPECT_NE(message(r).find("mm_processor_kwargs.min_pixels"), std::string::npos) << r.dump();
  r = send(big, {{"min_pixels", 70000}, {"max_pixels", 60000}}, 400);
  EXPECT_NE(message(r).find("above max_pixels"), std::string::npos) << r.dump();
  r = send(big, {{"do_resize", false}}, 400);
  EXPECT_NE(message(r).find("mm_processor_kwargs.do_resize"), std::string::npos) << r.dump();
  r = send(big, 5, 400);
  EXPECT_NE(message(r).find("mm_processor_kwargs"), std::string::npos) << r.dump();
  r = send(big, {{"max_pixels", "many"}}, 400);
  EXPECT_NE(message(r).find("mm_processor_kwargs.max_pixels"), std::string::npos) << r.dump();
  EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 200);
}

// Speculative decoding (MTP) serves images: the demo model (an MTP layer with --speculative-algorithm)
// answers a chat with an image exactly as without drafts, greedy, and its drafts were verified.
TEST(ServeVision, ImagesWithSpeculativeDecodingAnswerAsWithout) {
  const std::vector<std::string> demo = {"--model",           "demo",
                                         "--cache-memory-gb", "0.0625",
                                         "--chat-template",   "tests/fixtures/chat-templates/qwen3_5.jinja"};
  auto with = demo;
  with.insert(with.end(), {"--speculative-algorithm", "mtp", "--speculative-num-steps", "2"});
  auto plain = start(demo), mtp = start(with);
  json body = {{"model", "moeserve-demo"},
               {"max_tokens", 12},
               {"temperature", 0},
               {"ignore_eos", true},
               {"return_token_ids", true},
               {"messages",
                {{{"role", "user"},
                  {"content",
                   {{{"type", "image_url"}, {"image_url", {{"url", png_data_url(fixture_image(1))}}}},
                    {{"type", "text"}, {"text", "What is in this picture?"}}}}}}}};
  auto ask = [&](uint16_t port) {
    auto r = Connection(port).roundtrip("POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int64_t>(), 70) << "the image's tokens are in the prompt";
    return j["choices"][0]["token_ids"];
  };
  const json want = ask(plain->port());
  EXPECT_EQ(want.size(), 12u);
  EXPECT_EQ(ask(mtp->port()), want);
  EXPECT_GT(metric(mtp->port(), "moeserve:spec_decode_num_drafts_total"), 0) << mtp->output();
}

// The Responses API's input_image and an Anthropic image block (base64 source) reach the tower as chat
// image parts do: their tokens are in the prompt, and a malformed one is a 400 naming it.
TEST(ServeVision, ResponsesInputImageAndMessagesImageBlock) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--chat-template",
                  "tests/fixtures/chat-templates/qwen3_5.jinja"});
  const std::string data = base64(fixture_image(1));  // 70 image tokens
  json responses = {{"model", "moeserve-demo"},
                    {"max_output_tokens", 2},
                    {"input",
                     {{{"role", "user"},
                       {"content",
                        {{{"type", "input_text"}, {"text", "What is this?"}},
                         {{"type", "input_image"}, {"image_url", "data:image/png;base64," + data}}}}}}}};
  auto r = Connection(p->port()).roundtrip("POST", "/v1/responses", responses.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body)["usage"]["input_tokens"].get<int>(), 70) << r.body;
  json messages = {
      {"model", "moeserve-demo"},
      {"max_tokens", 2},
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", data}}}},
           {{"type", "text"}, {"text", "What is this?"}}}}}}}};
  r = Connection(p->port()).roundtrip("POST", "/v1/messages", messages.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body)["usage"]["input_tokens"].get<int>(), 70) << r.body;
  messages["messages"][0]["content"][0]["source"]["data"] = "AAAA";
  r = Connection(p->port()).roundtrip("POST", "/v1/messages", messages.dump());
  EXPECT_EQ(r.status, 400) << r.body;
}

// The official OpenAI SDK sends a data-URL image to the demo model's random tower, straight and through
// `moeserve route` (tests/server/js/vision_test.mjs says what it checks).
TEST(ServeVision, OfficialOpenAiSdkSendsImagesThroughServeAndRoute) {
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0)
      << "node is missing: run scripts/install-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("tests/server/js/node_modules/openai/package.json"))
      << "the npm SDK is missing: run tests/server/js/install.sh (scripts/fetch-test-data.sh does)";
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--chat-template",
                  "tests/fixtures/chat-templates/qwen3_5.jinja"});
  const uint16_t router_port = peers::free_port();
  ServeProcess router({"--host", "127.0.0.1", "--port", std::to_string(router_port), "--workers", "1",
                       "--backend", "http://127.0.0.1:" + std::to_string(p->port())},
                      "", {}, "route");
  ASSERT_TRUE(router.wait_for("route: listening on")) << router.output();
  for (uint16_t port : {p->port(), router_port}) {
    peers::RunResult r = peers::run_process({"node", "tests/server/js/vision_test.mjs",
                                             "http://127.0.0.1:" + std::to_string(port), "moeserve-demo"});
    EXPECT_EQ(r.status, 0) << r.out << r.err << "\nserver:\n" << p->output();
    EXPECT_NE(r.out.find("all vision SDK checks passed"), std::string::npos) << r.out << r.err;
  }
}

}  // namespace
}  // namespace moeserve::server
