// MTP speculative decoding composes with the server's text pipeline: the real `moeserve serve` with
// --speculative-algorithm NEXTN answers greedy requests exactly as the same server without it does — stop
// strings that complete inside a run of accepted drafts, reasoning and tool-call parsing, JSON output after
// the reasoning, streaming, n > 1 and concurrent requests.
//
// Random weights draft nothing right (docs/engine.md), and then every step emits one token as plain decoding
// does, which proves nothing about several tokens per step. So the model here is made to draft well: every
// layer's output projections are zero, so the hidden state at a position is the embedding of its token and
// the next token depends on the current one alone, t' = f(t) = argmax(lm_head · norm(embed(t))). The MTP
// layer's fc passes the embedding half through and its decoder layer adds nothing either, so it drafts f of
// the token it is fed: the model's own next token, up to bf16 rounding (a near tie now and then is a rejected
// draft, so rollbacks happen too). lm_head rows are then set so that f follows a script after the thinking
// prompt's last token, with </think> inside it and <tool_call> at its end; past the script f is the random
// map's chain.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "http_connection.h"
#include "model/init_model.h"
#include "model/safetensors.h"
#include "serve_process.h"
#include "text/tokenizer.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;
using testing_http::Connection;
using testing_http::sse_data;

const char* kTokenizer = ".cache/tokenizer-qwen3/tokenizer.json";
const char* kQwen35Template = "tests/fixtures/chat-templates/qwen3_5.jinja";
// What the model thinks and then says after Qwen3.5's generation prompt ("...assistant\n<think>\n"); the
// thinking-off prompt ends with the "\n\n" after </think>, so it starts at the answer.
const char* kReasoning = "Let me look up the weather";
const char* kAnswer = "Paris is sunny today.";

// The tiny preset with an MTP layer and the real Qwen3 vocabulary, written to `dir` and rewired as the file
// comment says. Returns the scripted chain's token ids (after the prompt's last token).
std::vector<int32_t> write_drafting_model(const text::Tokenizer& tokenizer,
                                          const std::filesystem::path& dir) {
  auto one = [&](const char* piece) {
    auto ids = tokenizer.encode(piece, false);
    EXPECT_EQ(ids.size(), 1u) << piece;
    return ids.at(0);
  };
  std::vector<int32_t> chain = {one("\n")};  // the thinking prompt's last token
  for (int32_t id : tokenizer.encode(kReasoning, false)) chain.push_back(id);
  chain.push_back(one("</think>"));
  chain.push_back(one("\n\n"));
  for (int32_t id : tokenizer.encode(kAnswer, false)) chain.push_back(id);
  chain.push_back(one("<tool_call>"));  // opens a call the random chain then fills
  // f maps each token to one successor, so the script may not repeat a token.
  EXPECT_EQ(std::set<int32_t>(chain.begin(), chain.end()).size(), chain.size());

  ModelConfig config = preset_config("tiny");
  config.mtp_num_layers = 1;
  InitModelOptions options;
  options.vocab_from = kTokenizer;
  options.chat_template = kQwen35Template;
  init_model(config, dir.string(), options);

  const std::filesystem::path weights = dir / "model.safetensors";
  std::vector<std::vector<uint16_t>> values;
  std::vector<TensorWrite> out;
  {
    const TensorSet set = TensorSet::open_file(weights.string());
    const TensorInfo* embed = set.find("model.embed_tokens.weight");
    const int64_t hidden = config.hidden_size;
    for (const TensorInfo& t : set.tensors()) {
      EXPECT_EQ(t.dtype, DType::BF16) << t.name;
      std::vector<uint16_t>& v = values.emplace_back(size_t(t.numel()));
      std::memcpy(v.data(), t.data, t.nbytes);
      const bool adds_to_residual = t.name.find("o_proj") != std::string::npos ||
                                    t.name.find("out_proj") != std::string::npos ||
                                    t.name.find("down_proj") != std::string::npos;
      // Zero-centred norms at 0 scale every dimension alike, so both paths rank the vocabulary alike.
      const bool scales = t.name == "model.norm.weight" || t.name == "mtp.norm.weight" ||
                          t.name == "mtp.pre_fc_norm_embedding.weight";
      if (adds_to_residual || scales) std::fill(v.begin(), v.end(), uint16_t(0));
      if (t.name == "mtp.fc.weight") {  // [hidden, 2 * hidden]: the embedding half as is, the hidden ignored
        std::fill(v.begin(), v.end(), uint16_t(0));
        for (int64_t i = 0; i < hidden; ++i) v[size_t(i * 2 * hidden + i)] = f32_to_bf16(1.0f);
      }
      if (t.name == "lm_head.weight") {
        // Row chain[i + 1] along embed(chain[i]), unit length: its logit after chain[i] is sqrt(hidden) = 8,
        // where a random row's is about N(0, 1) (the vocabulary's largest about 4.5). After any other token a
        // scripted row's is about N(0, 1) too, so the random chain past the script seldom falls back into it.
        const auto* e = reinterpret_cast<const uint16_t*>(embed->data);
        for (size_t i = 0; i + 1 < chain.size(); ++i) {
          const uint16_t* from = e + chain[i] * hidden;
          double norm = 0;
          for (int64_t k = 0; k < hidden; ++k) norm += std::pow(bf16_to_f32(from[k]), 2);
          for (int64_t k = 0; k < hidden; ++k)
            v[size_t(chain[i + 1] * hidden + k)] = f32_to_bf16(float(bf16_to_f32(from[k]) / std::sqrt(norm)));
        }
      }
      out.push_back(TensorWrite::copy_of(t.name, t.dtype, t.shape,
                                         {reinterpret_cast<const uint8_t*>(v.data()), t.nbytes}));
    }
  }
  write_safetensors((dir / "rewired.safetensors").string(), out);
  std::filesystem::rename(dir / "rewired.safetensors", weights);
  return {chain.begin() + 1, chain.end()};
}

json post(uint16_t port, const std::string& path, const json& body) {
  auto r = Connection(port).roundtrip("POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << path << " " << body.dump() << " -> " << r.body;
  return json::parse(r.body, nullptr, false);
}

// A streamed answer: its SSE payloads (without [DONE]) and the usage chunk's usage.
struct Stream {
  std::vector<json> chunks;
  json usage;
};

Stream post_stream(uint16_t port, const std::string& path, json body) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = Connection(port).roundtrip("POST", path, body.dump());
  EXPECT_EQ(r.status, 200) << path << " " << body.dump() << " -> " << r.body;
  Stream s;
  auto events = sse_data(r.body);
  EXPECT_TRUE(!events.empty() && events.back() == "[DONE]") << r.body;
  for (const std::string& data : events) {
    if (data == "[DONE]") continue;
    json chunk = json::parse(data);
    if (chunk["choices"].empty() && chunk.contains("usage"))
      s.usage = chunk["usage"];
    else
      s.chunks.push_back(std::move(chunk));
  }
  return s;
}

// Usage but the cached tokens: a prompt asked again comes from the prefix cache.
void expect_same_counts(const json& got, const json& want) {
  for (const char* key : {"prompt_tokens", "completion_tokens", "total_tokens"})
    EXPECT_EQ(got[key], want[key]) << key;
}

// The whole choices a completions stream adds up to, as the non-streamed answer shows them.
json joined_completion(const Stream& s) {
  json choices = json::array();
  for (const json& chunk : s.chunks) {
    for (const json& c : chunk["choices"]) {
      const size_t i = c["index"];
      while (choices.size() <= i) {
        choices.push_back({{"index", choices.size()}, {"text", ""}, {"token_ids", json::array()}});
      }
      json& to = choices[i];
      to["text"] = to["text"].get<std::string>() + c["text"].get<std::string>();
      for (const json& id : c.value("token_ids", json::array())) to["token_ids"].push_back(id);
      if (!c["logprobs"].is_null()) {
        if (!to.contains("logprobs"))
          to["logprobs"] = c["logprobs"];
        else
          for (auto list = c["logprobs"].begin(); list != c["logprobs"].end(); ++list)
            for (const json& x : *list) to["logprobs"][list.key()].push_back(x);
      }
      if (!c["finish_reason"].is_null()) {
        to["finish_reason"] = c["finish_reason"];
        to["stop_reason"] = c["stop_reason"];
      }
    }
  }
  return choices;
}

// The non-streamed choices cut to what a stream carries (token ids, no prompt ids).
json streamable(json choices) {
  for (json& c : choices) {
    c.erase("prompt_token_ids");
    if (c["logprobs"].is_null()) c.erase("logprobs");
  }
  return choices;
}

// Tool calls carry an id drawn per request; the rest of a chat answer is what the model said.
json without_call_ids(json choices) {
  for (json& c : choices)
    if (c["message"].contains("tool_calls"))
      for (json& call : c["message"]["tool_calls"]) call.erase("id");
  return choices;
}

// The messages a chat stream adds up to: content, reasoning and calls (name and arguments) per choice.
json joined_chat(const Stream& s) {
  json choices = json::array();
  for (const json& chunk : s.chunks) {
    for (const json& c : chunk["choices"]) {
      const size_t i = c["index"];
      while (choices.size() <= i) {
        choices.push_back({{"content", ""},
                           {"reasoning_content", ""},
                           {"tool_calls", json::array()},
                           {"logprobs", json::array()}});
      }
      json& to = choices[i];
      const json& d = c["delta"];
      for (const char* key : {"content", "reasoning_content"})
        if (d.contains(key) && d[key].is_string())
          to[key] = to[key].get<std::string>() + d[key].get<std::string>();
      for (const json& call : d.value("tool_calls", json::array())) {
        const size_t k = call["index"];
        while (to["tool_calls"].size() <= k)
          to["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
        json& fn = to["tool_calls"][k]["function"];
        fn["name"] = fn["name"].get<std::string>() + call["function"].value("name", "");
        fn["arguments"] = fn["arguments"].get<std::string>() + call["function"].value("arguments", "");
      }
      if (!c["logprobs"].is_null())
        for (const json& entry : c["logprobs"]["content"]) to["logprobs"].push_back(entry);
      if (!c["finish_reason"].is_null()) to["finish_reason"] = c["finish_reason"];
    }
  }
  return choices;
}

// The same fields of a non-streamed chat answer.
json chat_fields(const json& answer) {
  json choices = json::array();
  for (const json& c : answer["choices"]) {
    const json& m = c["message"];
    json calls = m.value("tool_calls", json::array());
    for (json& call : calls) call.erase("id");
    choices.push_back({{"content", m["content"].is_string() ? m["content"] : json("")},
                       {"reasoning_content", m.value("reasoning_content", "")},
                       {"tool_calls", calls},
                       {"logprobs", c["logprobs"].is_null() ? json::array() : c["logprobs"]["content"]},
                       {"finish_reason", c["finish_reason"]}});
  }
  return choices;
}

// Two tools: a call of either (tool_choice "required") leaves the name to the model.
const json& weather_tool() {
  static const json tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"parameters",
         {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};
  return tool;
}
const json& forecast_tool() {
  static const json tool = {
      {"type", "function"},
      {"function",
       {{"name", "forecast"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
          {"required", {"days"}}}}}}};
  return tool;
}

class ServeSpeculative : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kTokenizer)) << "run scripts/fetch-test-data.sh first";
    dir_ = std::filesystem::temp_directory_path() / fmt::format("moeserve-drafting-{}", ::getpid());
    std::filesystem::create_directories(dir_);
    tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(kTokenizer));
    script_ = write_drafting_model(*tokenizer_, dir_);
    std::vector<std::string> args = {"--model", dir_.string(),     "--cache-memory-gb",
                                     "0.0625",  "--max-model-len", "1024"};
    for (const std::string& flag : flags()) args.push_back(flag);
    plain_ = std::make_unique<ServeProcess>(args);
    std::vector<std::string> speculative = args;
    for (const char* flag : {"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"})
      speculative.push_back(flag);
    spec_ = std::make_unique<ServeProcess>(speculative);
    ASSERT_TRUE(plain_->wait_ready()) << plain_->output();
    ASSERT_TRUE(spec_->wait_ready()) << spec_->output();
  }
  // Serve flags both servers take (a tool-call parser).
  virtual std::vector<std::string> flags() const { return {}; }

  void TearDown() override {
    plain_.reset();
    spec_.reset();
    std::filesystem::remove_all(dir_);
  }

  double metric(const std::string& name) const {
    const std::string body = Connection(spec_->port()).roundtrip("GET", "/metrics").body;
    for (size_t at = body.find(name); at != std::string::npos; at = body.find(name, at + 1)) {
      if (at != 0 && body[at - 1] != '\n') continue;
      const std::string line = body.substr(at, body.find('\n', at) - at);
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    return -1;
  }

  // Most steps emitted several tokens: the drafts were accepted.
  void expect_bursts() const {
    EXPECT_GT(metric("moeserve:spec_decode_mean_acceptance_length"), 2.0) << spec_->output();
  }

  // A chat request ("Weather in Paris?" plus `extra`): the speculative server's answer is the plain one's,
  // whole and streamed; a forced call is one call. Returns the plain answer and the speculative stream.
  std::pair<json, Stream> expect_chat_as_plain(const json& extra) const {
    json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                 {"max_tokens", 40},
                 {"temperature", 0}};
    body.update(extra);
    const json want = post(plain_->port(), "/v1/chat/completions", body);
    const json got = post(spec_->port(), "/v1/chat/completions", body);
    EXPECT_EQ(without_call_ids(got["choices"]), without_call_ids(want["choices"]));
    EXPECT_EQ(got["usage"], want["usage"]);
    Stream streamed = post_stream(spec_->port(), "/v1/chat/completions", body);
    EXPECT_EQ(joined_chat(streamed), chat_fields(want));
    expect_same_counts(streamed.usage, want["usage"]);
    if (extra.contains("tool_choice")) {
      EXPECT_EQ(want["choices"][0]["message"]["tool_calls"].size(), 1u) << want.dump();
    }
    return {want, std::move(streamed)};
  }

  std::filesystem::path dir_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::vector<int32_t> script_;
  std::unique_ptr<ServeProcess> plain_, spec_;
};

// The model is what the tests below need: after the thinking prompt it says the script, in steps of several
// tokens with speculative decoding.
TEST_F(ServeSpeculative, TheDraftingModelSaysItsScriptInBursts) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                     {"max_tokens", int(script_.size())},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  for (const ServeProcess* p : {plain_.get(), spec_.get()}) {
    const json r = post(p->port(), "/v1/chat/completions", body);
    EXPECT_EQ(r["choices"][0]["token_ids"], json(script_)) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], kReasoning) << r.dump();
    // No tools offered: the call's opening is text.
    EXPECT_EQ(r["choices"][0]["message"]["content"], std::string(kAnswer) + "<tool_call>") << r.dump();
  }
  expect_bursts();
}

// Text stop strings chosen from the plain answer, each completed by the first token of a step that emitted
// several: the speculative server cuts the text, the token ids, the logprobs and the usage where plain
// decoding cuts them, whole and streamed, and the stream shows nothing past the cut.
TEST_F(ServeSpeculative, StopStringsInsideAStepCutWherePlainDecodingCuts) {
  const json base = {{"prompt", "Weather report:"},
                     {"max_tokens", 48},
                     {"temperature", 0},
                     {"return_token_ids", true},
                     {"logprobs", 2}};
  const json whole = post(plain_->port(), "/v1/completions", base);
  const Stream steps = post_stream(spec_->port(), "/v1/completions", base);
  ASSERT_EQ(joined_completion(steps), streamable(whole["choices"]));
  const std::string text = whole["choices"][0]["text"];
  const std::vector<int32_t> ids = whole["choices"][0]["token_ids"];

  // A chunk per engine step: a stop string completed by a step's first token leaves the step's other tokens
  // behind. Cuts that split a character are left out.
  auto kept_text = [&](size_t cut) { return tokenizer_->decode(std::span(ids.data(), cut)); };
  std::vector<size_t> cuts;  // how many tokens the answer keeps
  size_t seen = 0;
  for (const json& chunk : steps.chunks) {
    const size_t n = chunk["choices"][0].value("token_ids", json::array()).size();
    if (n >= 2 && seen + 1 < ids.size() && text.starts_with(kept_text(seen + 1))) cuts.push_back(seen + 1);
    seen += n;
  }
  ASSERT_GE(cuts.size(), 3u) << steps.chunks.size() << " steps for " << ids.size() << " tokens";
  std::vector<std::string> stops;
  for (size_t cut : {cuts.front(), cuts[cuts.size() / 2], cuts.back()}) {
    const std::string kept = kept_text(cut);
    // The shortest text ending there that occurs nowhere earlier, whole characters.
    std::string stop;
    for (size_t n = 1; n <= kept.size() && stop.empty(); ++n) {
      const bool continues_a_character = (uint8_t(kept[kept.size() - n]) & 0xC0) == 0x80;
      if (!continues_a_character && text.find(kept.substr(kept.size() - n)) == kept.size() - n)
        stop = kept.substr(kept.size() - n);
    }
    SCOPED_TRACE(::testing::Message() << "stop " << json(stop).dump() << " after token " << cut);
    json body = base;
    body["stop"] = {stop};
    const json want = post(plain_->port(), "/v1/completions", body);
    const json& c = want["choices"][0];
    EXPECT_EQ(c["finish_reason"], "stop");
    EXPECT_EQ(c["stop_reason"], stop);
    EXPECT_EQ(c["text"], kept.substr(0, kept.size() - stop.size()));
    EXPECT_EQ(c["token_ids"], json(std::vector<int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(cut))));
    EXPECT_EQ(want["usage"]["completion_tokens"], cut);
    const json got = post(spec_->port(), "/v1/completions", body);
    EXPECT_EQ(got["choices"], want["choices"]);
    EXPECT_EQ(got["usage"], want["usage"]);
    const Stream streamed = post_stream(spec_->port(), "/v1/completions", body);
    EXPECT_EQ(joined_completion(streamed), streamable(want["choices"]));
    expect_same_counts(streamed.usage, want["usage"]);
    stops.push_back(stop);
  }
  // Several stop strings at once, the latest first: the earliest in the text wins; kept in the text when
  // asked.
  json body = base;
  body["stop"] = {stops[2], stops[1], stops[0]};
  body["include_stop_str_in_output"] = true;
  const json want = post(plain_->port(), "/v1/completions", body);
  EXPECT_EQ(want["choices"][0]["stop_reason"], stops[0]);
  EXPECT_EQ(post(spec_->port(), "/v1/completions", body)["choices"], want["choices"]);
  EXPECT_EQ(joined_completion(post_stream(spec_->port(), "/v1/completions", body)),
            streamable(want["choices"]));
  expect_bursts();
}

// Chat answers through the reasoning parser and the qwen3_coder tool parser: thinking on (the reasoning ends
// inside a step) and off; JSON output constrained after the reasoning; a regex after the reasoning and a
// choice that the scripted answer fits (so its drafts are accepted under the constraint); calls forced by
// tool_choice (one tool, or a choice among two); tools offered but not called; stop strings inside the
// reasoning, across its end (with logprobs) and in the answer; n = 2. Whole and streamed, the speculative
// server says what the plain one says.
TEST_F(ServeSpeculative, ChatParsersToolCallsAndJsonEqualPlainDecoding) {
  const json thinking_off = {{"enable_thinking", false}};
  const json schema = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}}}, {"sunny", {{"type", "boolean"}}}}},
                       {"required", {"city", "sunny"}}};
  const std::vector<json> extras = {
      json::object(),
      {{"chat_template_kwargs", thinking_off}},
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}}}},
      {{"tools", {weather_tool()}}, {"tool_choice", "required"}},
      {{"tools", {weather_tool(), forecast_tool()}},
       {"tool_choice", "required"},
       {"chat_template_kwargs", thinking_off}},
      {{"tools", {weather_tool()}},
       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
      {{"tools", {weather_tool(), forecast_tool()}}},
      {{"structured_outputs", {{"regex", "\\s*Paris is [a-z ]+\\."}}}},
      {{"structured_outputs", {{"choice", {"It rains.", "Paris is sunny today."}}}},
       {"chat_template_kwargs", thinking_off}},
      {{"stop", {"up the"}}},
      {{"stop", {"</think>\n\nParis"}}, {"logprobs", true}, {"top_logprobs", 2}},
      {{"stop", {"sunny"}}, {"n", 2}},
  };
  for (const json& extra : extras) {
    SCOPED_TRACE(extra.dump());
    const auto [want, streamed] = expect_chat_as_plain(extra);
    if (extra.contains("structured_outputs")) {  // the script's answer fits: its drafts pass the constraint
      EXPECT_EQ(want["choices"][0]["message"]["content"], kAnswer) << want.dump();
      EXPECT_EQ(want["choices"][0]["finish_reason"], "stop");
    }
    if (extra.contains("logprobs")) {  // the stop string that spans the end of the reasoning cut it
      const json& m = want["choices"][0]["message"];
      EXPECT_EQ(want["choices"][0]["finish_reason"], "stop");
      EXPECT_EQ(m["reasoning_content"], kReasoning) << want.dump();
      EXPECT_EQ(m["content"], "") << want.dump();
    }
    if (extra.empty()) {
      // The step that ended the reasoning also began the answer.
      EXPECT_TRUE(std::any_of(streamed.chunks.begin(), streamed.chunks.end(), [](const json& chunk) {
        const json& d = chunk["choices"][0]["delta"];
        return d.contains("reasoning_content") && d.contains("content");
      }));
    }
  }
  expect_bursts();
}

// Requests running together take steps of different lengths in one batch; each still gets the plain
// server's answer (n = 2 among them, and a seeded sample, whose drafts are mostly rejected).
TEST_F(ServeSpeculative, ConcurrentRequestsEqualPlainDecoding) {
  const std::vector<std::string> prompts = {"Weather report:", "The capital of France is", "1, 2, 3,",
                                            "Once upon a time"};
  std::vector<json> bodies, want;
  for (size_t i = 0; i < prompts.size(); ++i) {
    bodies.push_back({{"prompt", prompts[i]},
                      {"max_tokens", 32 + 4 * int(i)},
                      {"temperature", i == 3 ? 1 : 0},
                      {"seed", 7},
                      {"return_token_ids", true},
                      {"n", i == 1 ? 2 : 1}});
    want.push_back(post(plain_->port(), "/v1/completions", bodies.back()));
  }
  std::vector<json> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] { got[i] = post(spec_->port(), "/v1/completions", bodies[i]); });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i]["choices"], want[i]["choices"]) << prompts[i];
    EXPECT_EQ(got[i]["usage"], want[i]["usage"]) << prompts[i];
  }
  expect_bursts();
}

// The Responses API's output_text logprobs are those of the answer's tokens alone, also when one step
// brings the end of the reasoning and the start of the answer: plain decoding's, whole and streamed.
TEST_F(ServeSpeculative, ResponsesLogprobsAreTheAnswerTokensAlone) {
  const json body = {{"input", "Weather in Paris?"},
                     {"max_output_tokens", 30},
                     {"temperature", 0},
                     {"top_logprobs", 1},
                     {"include", {"message.output_text.logprobs"}}};
  auto answer_logprobs = [](const json& response) {
    for (const json& item : response["output"])
      if (item["type"] == "message") return item["content"][0]["logprobs"];
    return json();
  };
  const json want = answer_logprobs(post(plain_->port(), "/v1/responses", body));
  ASSERT_TRUE(want.is_array() && !want.empty()) << want.dump();
  EXPECT_EQ(want[0]["token"], "Paris");  // the answer's first token, not the reasoning's last
  for (const ServeProcess* p : {plain_.get(), spec_.get()}) {
    EXPECT_EQ(answer_logprobs(post(p->port(), "/v1/responses", body)), want);
    json streamed_body = body;
    streamed_body["stream"] = true;
    const auto r = Connection(p->port()).roundtrip("POST", "/v1/responses", streamed_body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json streamed = json::array();
    for (const std::string& data : sse_data(r.body)) {
      const json e = json::parse(data);
      if (e["type"] == "response.output_text.delta")
        for (const json& entry : e["logprobs"]) streamed.push_back(entry);
    }
    EXPECT_EQ(streamed, want);
  }
  expect_bursts();
}

// A conversation: each turn's prompt holds the earlier answers, so it starts from what the previous,
// speculative turn filed in the prefix cache; every turn says what the plain server's says.
TEST_F(ServeSpeculative, ConversationTurnsFromThePrefixCacheEqualPlainDecoding) {
  json messages = json::array();
  for (int turn = 1; turn <= 4; ++turn) {
    SCOPED_TRACE(turn);
    messages.push_back({{"role", "user"}, {"content", fmt::format("Turn {}: and tomorrow?", turn)}});
    const json body = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
    const json want = post(plain_->port(), "/v1/chat/completions", body);
    const json got = post(spec_->port(), "/v1/chat/completions", body);
    EXPECT_EQ(got["choices"], want["choices"]);
    EXPECT_EQ(got["usage"], want["usage"]);  // the same cached prefix too
    if (turn == 4) {
      EXPECT_GT(got["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    }
    const json& m = want["choices"][0]["message"];
    messages.push_back(
        {{"role", "assistant"}, {"content", m["content"].is_string() ? m["content"] : json("")}});
  }
  expect_bursts();
}

// Forced calls in the hermes format: the JSON grammar of the call advances over a step's accepted tokens as
// over plain decoding's.
class ServeSpeculativeHermes : public ServeSpeculative {
  std::vector<std::string> flags() const override { return {"--tool-call-parser", "hermes"}; }
};

TEST_F(ServeSpeculativeHermes, ForcedAndOfferedCallsEqualPlainDecoding) {
  const json thinking_off = {{"enable_thinking", false}};
  for (const json& extra : {
           json{{"tools", {weather_tool()}}, {"tool_choice", "required"}},
           json{{"tools", {weather_tool(), forecast_tool()}},
                {"tool_choice", "required"},
                {"chat_template_kwargs", thinking_off}},
           json{{"tools", {weather_tool(), forecast_tool()}}},
       }) {
    SCOPED_TRACE(extra.dump());
    expect_chat_as_plain(extra);
  }
  expect_bursts();
}

}  // namespace
}  // namespace moeserve::server
