// The prompt generator, the dialogues of the scenarios and the image scenario's pictures, without a network.
#include <gtest/gtest.h>
#include <png.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loadgen/prompt.h"
#include "loadgen/scenario.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

TEST(Prompt, SameSeedAndStreamGiveTheSameText) {
  PromptGenerator a(42), b(42), c(43);
  EXPECT_EQ(a.text(100, 5), b.text(100, 5));
  EXPECT_NE(a.text(100, 5), a.text(100, 6));
  EXPECT_NE(a.text(100, 5), c.text(100, 5));
  EXPECT_NE(a.text(50, 1).substr(0, 20), a.text(50, 2).substr(0, 20));  // no shared prefix between requests
}

TEST(Prompt, WithoutTokenizerLengthIsWordsAndFullStops) {
  PromptGenerator g(1);
  EXPECT_FALSE(g.exact());
  for (size_t n : {0, 1, 2, 17, 256, 1000}) EXPECT_EQ(g.count(g.text(n, n)), n) << n;
  EXPECT_EQ(g.count("one two. three"), 4u);
}

// A tokenizer that merges some neighbouring words ("of the" is one token), as real BPE vocabularies can:
// the generator must still hit the length exactly.
size_t merging_counter(std::string_view text) {
  size_t words = 0, merges = 0;
  bool in_word = false;
  for (char c : text) {
    if (c == ' ' || c == '.') {
      words += c == '.';
      in_word = false;
    } else if (!in_word) {
      ++words;
      in_word = true;
    }
  }
  for (size_t p = text.find("of the"); p != std::string_view::npos; p = text.find("of the", p + 1)) ++merges;
  return words - merges;
}

TEST(Prompt, TokenCounterMakesLengthsExact) {
  PromptGenerator g(7, merging_counter);
  EXPECT_TRUE(g.exact());
  for (size_t n : {1, 5, 64, 256, 2048})
    for (uint64_t stream = 0; stream < 5; ++stream) EXPECT_EQ(merging_counter(g.text(n, stream)), n);
}

// The real Qwen3 tokenizer (scripts/fetch-test-data.sh puts it in .cache/): every length is exact.
TEST(Prompt, ExactLengthsWithTheQwen3Tokenizer) {
  TokenCounter qwen3 = load_token_counter(".cache/tokenizer-qwen3");
  PromptGenerator g(11, qwen3);
  for (size_t n : {1, 2, 16, 128, 256, 1000, 4096})
    for (uint64_t stream = 0; stream < 3; ++stream)
      EXPECT_EQ(qwen3(g.text(n, stream)), n) << n << " " << stream;
  EXPECT_EQ(load_token_counter(".cache/tokenizer-qwen3/tokenizer.json")("Hello world"), 2u);
  EXPECT_THROW(load_token_counter("/nonexistent/tokenizer.json"), Error);
}

TEST(Prompt, RejectsATokenizerThatSplitsWords) {
  EXPECT_THROW(PromptGenerator(1, [](std::string_view t) { return t.size(); }), Error);
}

WorkloadOptions options(Scenario s) {
  WorkloadOptions o;
  o.scenario = s;
  o.model = "m";
  o.input_len = 32;
  o.output_len = 8;
  o.turns = 3;
  return o;
}

Reply reply(std::string content) {
  Reply r;
  r.content = std::move(content);
  return r;
}

TEST(Scenario, NamesRoundTrip) {
  for (Scenario s : all_scenarios()) EXPECT_EQ(parse_scenario(scenario_name(s)), s);
  EXPECT_EQ(parse_scenario("image"), Scenario::image);
  EXPECT_EQ(all_scenarios().size(), 4u);  // "all" is the text scenarios: a text-only server refuses images
  EXPECT_THROW(parse_scenario("chat"), Error);
}

TEST(Scenario, SingleTurnAsksForExactOutputLength) {
  PromptGenerator g(1);
  auto o = options(Scenario::single_turn);
  o.extra_body = {{"top_k", 1}};
  Conversation c(o, g, 0);
  TurnRequest r = c.next();
  json body = json::parse(r.body);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["min_tokens"], 8);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["top_k"], 1);
  EXPECT_FALSE(body.contains("tools"));
  ASSERT_EQ(body["messages"].size(), 1u);
  EXPECT_EQ(g.count(body["messages"][0]["content"].get<std::string>()), 32u);
  EXPECT_EQ(r.expected_input_tokens, 32u);
  EXPECT_TRUE(r.exact_output);
  c.complete(reply("ok"));
  EXPECT_TRUE(c.done());

  o.ignore_eos = false;
  Conversation plain(o, g, 0);
  json b2 = json::parse(plain.next().body);
  EXPECT_FALSE(b2.contains("ignore_eos"));
  EXPECT_FALSE(b2.contains("min_tokens"));
}

TEST(Scenario, LongGenerationUsesTheLongLength) {
  PromptGenerator g(1);
  auto o = options(Scenario::long_gen);
  o.long_output_len = 4096;
  Conversation c(o, g, 0);
  EXPECT_EQ(json::parse(c.next().body)["max_tokens"], 4096);
}

TEST(Scenario, MultiTurnCarriesTheConversationForward) {
  PromptGenerator g(1);
  Conversation c(options(Scenario::multi_turn), g, 4);
  json first = json::parse(c.next().body);
  c.complete(reply("answer one"));
  json second = json::parse(c.next().body);
  c.complete(reply("answer two"));
  json third = json::parse(c.next().body);
  c.complete(reply("answer three"));
  EXPECT_TRUE(c.done());
  ASSERT_EQ(third["messages"].size(), 5u);
  // Each prompt is the previous prompt, the reply to it, and a new user message.
  EXPECT_EQ(second["messages"][0], first["messages"][0]);
  EXPECT_EQ(second["messages"][1], (json{{"role", "assistant"}, {"content", "answer one"}}));
  EXPECT_EQ(third["messages"][3], (json{{"role", "assistant"}, {"content", "answer two"}}));
  EXPECT_EQ(third["messages"][4]["role"], "user");
  EXPECT_NE(third["messages"][4]["content"], third["messages"][2]["content"]);
}

TEST(Scenario, PromptSetsAndScenariosShareNoPrompt) {
  PromptGenerator g(1);
  auto first_prompt = [&](Scenario s, size_t set) {
    auto o = options(s);
    o.prompt_set = set;
    Conversation c(o, g, 0);
    return json::parse(c.next().body)["messages"][0]["content"].get<std::string>();
  };
  EXPECT_EQ(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::single_turn, 0));
  EXPECT_NE(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::single_turn, 1));
  EXPECT_NE(first_prompt(Scenario::single_turn, 0), first_prompt(Scenario::multi_turn, 0));
}

TEST(Scenario, FailedTurnEndsTheDialogue) {
  PromptGenerator g(1);
  Conversation c(options(Scenario::multi_turn), g, 0);
  c.next();
  c.abandon();
  EXPECT_TRUE(c.done());
}

TEST(Scenario, ToolCallFeedsTheResultBack) {
  PromptGenerator g(1);
  auto o = options(Scenario::tool_call);
  Conversation c(o, g, 0);
  TurnRequest first = c.next();
  json b1 = json::parse(first.body);
  ASSERT_TRUE(b1.contains("tools"));
  EXPECT_EQ(b1["tools"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(b1["tool_choice"], "auto");
  EXPECT_FALSE(b1.contains("ignore_eos"));  // the model must be free to end its tool call
  EXPECT_FALSE(first.exact_output);
  EXPECT_NEAR(static_cast<double>(first.expected_input_tokens), 32, 1);

  Reply r;
  r.tool_calls.push_back({"call_9", "get_weather", R"({"city": "Paris"})"});
  c.complete(r);
  EXPECT_TRUE(c.tool_call_returned());
  TurnRequest second = c.next();
  json b2 = json::parse(second.body);
  EXPECT_TRUE(b2.contains("tools"));
  EXPECT_EQ(b2["ignore_eos"], true);
  const json& m = b2["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_TRUE(m[1]["content"].is_null());
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_9");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "call_9");
  EXPECT_EQ(json::parse(m[2]["content"].get<std::string>())["condition"], "sunny");
  c.complete(reply("It is sunny."));
  EXPECT_TRUE(c.done());
}

TEST(Scenario, ToolCallStandsInACallWhenTheModelMadeNone) {
  PromptGenerator g(1);
  auto o = options(Scenario::tool_call);
  Conversation c(o, g, 1);
  c.next();
  c.complete(reply("I would rather chat."));
  EXPECT_FALSE(c.tool_call_returned());
  json m = json::parse(c.next().body)["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["content"], "I would rather chat.");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
}

// The bytes of a data: URL (standard base64, as image_data_url writes it).
std::string data_url_bytes(const std::string& url, const std::string& media_type) {
  const std::string head = "data:" + media_type + ";base64,";
  EXPECT_EQ(url.substr(0, head.size()), head);
  std::string out;
  uint32_t bits = 0;
  int held = 0;
  for (char c : url.substr(head.size())) {
    if (c == '=') break;
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t v = alphabet.find(c);
    EXPECT_NE(v, std::string::npos) << c;
    bits = bits << 6 | uint32_t(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out += char((bits >> held) & 0xFF);
    }
  }
  return out;
}

// libpng's reading of a PNG: its size and pixels.
std::vector<uint8_t> read_png(const std::string& bytes, int& width, int& height) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  EXPECT_TRUE(png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) << image.message;
  image.format = PNG_FORMAT_RGB;
  std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(image));
  EXPECT_TRUE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) << image.message;
  width = int(image.width), height = int(image.height);
  return pixels;
}

TEST(Images, PicturesAreDeterministicDistinctAndOfTheAskedSize) {
  const std::string a = synthetic_image(64, 48, 1, ImageEncoding::png);
  EXPECT_EQ(a, synthetic_image(64, 48, 1, ImageEncoding::png));
  int w = 0, h = 0;
  std::vector<uint8_t> pa = read_png(a, w, h);
  EXPECT_EQ(w, 64);
  EXPECT_EQ(h, 48);
  std::vector<uint8_t> pb = read_png(synthetic_image(64, 48, 2, ImageEncoding::png), w, h);
  EXPECT_NE(pa, pb);  // another seed, other pixels: the server's content hash differs
  const std::string jpeg = synthetic_image(64, 48, 1, ImageEncoding::jpeg);
  ASSERT_GT(jpeg.size(), 4u);
  EXPECT_EQ(jpeg.substr(0, 3), "\xff\xd8\xff");
  EXPECT_EQ(data_url_bytes(image_data_url(jpeg, ImageEncoding::jpeg), "image/jpeg"), jpeg);

  ImageShape shape;
  parse_image_size("1024x768", shape);
  EXPECT_EQ(shape.width, 1024);
  EXPECT_EQ(shape.height, 768);
  parse_image_size("448", shape);
  EXPECT_EQ(shape.width, 448);
  EXPECT_EQ(shape.height, 448);
  for (const char* bad : {"", "x", "0", "12x", "20000", "3x4x5", "-4"})
    EXPECT_THROW(parse_image_size(bad, shape), Error) << bad;
  EXPECT_THROW(parse_image_encoding("gif"), Error);
}

TEST(Scenario, ImageRequestsCarryNewPicturesBeforeTheQuestion) {
  PromptGenerator g(1);
  auto o = options(Scenario::image);
  o.images_per_request = 2;
  o.image = {40, 30, ImageEncoding::png};
  ImageSet set(o.image, 9, 4);  // two dialogues' pictures made up front, later ones when asked for
  o.images = &set;
  std::vector<std::string> urls;
  for (size_t dialogue = 0; dialogue < 3; ++dialogue) {
    Conversation c(o, g, dialogue);
    TurnRequest r = c.next();
    EXPECT_EQ(r.images, 2u);
    EXPECT_EQ(r.expected_input_tokens, 32u);
    json content = json::parse(r.body)["messages"][0]["content"];
    ASSERT_EQ(content.size(), 3u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(content[i]["type"], "image_url");
      std::string url = content[i]["image_url"]["url"];
      int w = 0, h = 0;
      read_png(data_url_bytes(url, "image/png"), w, h);
      EXPECT_EQ(w, 40);
      EXPECT_EQ(h, 30);
      urls.push_back(url);
    }
    EXPECT_EQ(content[2]["type"], "text");
    EXPECT_EQ(g.count(content[2]["text"].get<std::string>()), 32u);
    c.complete(reply("ok"));
    EXPECT_TRUE(c.done());
  }
  for (size_t i = 0; i < urls.size(); ++i)
    for (size_t j = i + 1; j < urls.size(); ++j) EXPECT_NE(urls[i], urls[j]) << i << " " << j;
  // Prepared or drawn when asked, picture i is the same.
  EXPECT_EQ(urls[1], ImageSet(o.image, 9, 0).url(1));
  EXPECT_EQ(urls[5], ImageSet(o.image, 9, 0).url(5));
}

}  // namespace
}  // namespace moeserve::loadgen
