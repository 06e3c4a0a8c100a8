// The streaming client end to end against a scripted OpenAI-compatible server on loopback
// (fake_openai_server.h): timings against the scripted delays, the four scenarios, failures by cause,
// request-rate and duration bounds, and the whole `moeserve bench` command.
#include "loadgen/client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "child_process.h"
#include "fake_openai_server.h"
#include "http_client.h"
#include "loadgen/benchmark.h"
#include "loadgen/report.h"
#include "loopback.h"
#include "run_process.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;
using testing::Failure;
using testing::FakeOpenAiServer;
using testing::FakeScript;

WorkloadOptions workload(Scenario s, size_t input_len = 24, size_t output_len = 6) {
  WorkloadOptions w;
  w.scenario = s;
  w.model = "fake-model";
  w.input_len = input_len;
  w.output_len = output_len;
  w.turns = 4;
  return w;
}

LoadOptions closed_loop(size_t concurrency, size_t requests) {
  LoadOptions l;
  l.concurrency = concurrency;
  l.num_requests = requests;
  l.request_timeout_s = 30;
  return l;
}

LoadResult run(const FakeOpenAiServer& server, const LoadOptions& load, const WorkloadOptions& w) {
  PromptGenerator prompts(1);
  return run_load(Endpoint::parse(server.url()), load, w, prompts);
}

TEST(Endpoint, ParsesHostPortAndPrefix) {
  Endpoint a = Endpoint::parse("http://127.0.0.1:30000");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, "30000");
  EXPECT_EQ(a.api("/chat/completions"), "/v1/chat/completions");
  Endpoint b = Endpoint::parse("http://gpu-7:8000/team/v1/");
  EXPECT_EQ(b.prefix, "/team");
  EXPECT_EQ(b.api("/models"), "/team/v1/models");
  EXPECT_EQ(Endpoint::parse("localhost").port, "80");
  EXPECT_EQ(Endpoint::parse("http://[::1]:9000").host, "::1");
  EXPECT_EQ(Endpoint::parse("http://[::1]:9000").url(), "http://[::1]:9000");
  EXPECT_THROW(Endpoint::parse("https://example.com"), std::exception);
  EXPECT_THROW(Endpoint::parse("http://host:port"), std::exception);
}

TEST(Client, TimingsFollowTheScriptedDelays) {
  FakeScript script;
  script.ttft_s = 0.10;
  script.itl_s = 0.02;
  FakeOpenAiServer server(script);
  // One at a time, so the n-th record and the n-th request the server saw are the same request.
  LoadResult result = run(server, closed_loop(1, 8), workload(Scenario::single_turn, 24, 10));
  auto served = server.served();
  ASSERT_EQ(result.records.size(), 8u);
  ASSERT_EQ(served.size(), 8u);
  auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
  for (size_t i = 0; i < 8; ++i) {
    const RequestRecord& r = result.records[i];
    ASSERT_TRUE(r.ok) << r.error_cause << ": " << r.error_message;
    EXPECT_EQ(r.http_status, 200);
    EXPECT_EQ(r.completion_tokens, 10u);
    EXPECT_EQ(r.chunks, 10u);
    EXPECT_EQ(r.itl_s.size(), 9u);  // one gap per pair of text chunks: none counted twice, none missed
    EXPECT_TRUE(r.usage_reported);
    // Lower bounds only (a loaded machine makes every measured interval longer, never shorter): the server
    // slept at least this long, and the client's TTFT contains the server's.
    EXPECT_GE(r.ttft_s, 0.10);
    EXPECT_GE(r.e2e_s, 0.10 + 9 * 0.02);
    ASSERT_EQ(served[i].token_sent.size(), 10u);
    EXPECT_GE(r.ttft_s, seconds(served[i].token_sent[0] - served[i].received));
    // The client's gaps end with the last chunk, which the server sent after its nine sleeps.
    double client_itl = 0;
    for (double g : r.itl_s) client_itl += g;
    EXPECT_GE(r.ttft_s + client_itl, 0.10 + 9 * 0.02);
  }
  for (const auto& s : served) {
    EXPECT_EQ(s.body["max_tokens"], 10);
    EXPECT_EQ(s.body["ignore_eos"], true);
    EXPECT_EQ(s.body["messages"][0]["role"], "user");
  }
  EXPECT_EQ(server.connections(), 1u);  // the kept-alive connection is reused
  EXPECT_GT(result.duration_s, 8 * 0.28);
}

TEST(Client, ConcurrentRequestsShareKeptAliveConnections) {
  FakeScript script;
  script.itl_s = 0.002;
  FakeOpenAiServer server(script);
  LoadResult result = run(server, closed_loop(4, 16), workload(Scenario::single_turn, 24, 10));
  ASSERT_EQ(result.records.size(), 16u);
  for (const auto& r : result.records) EXPECT_TRUE(r.ok) << r.error_cause;
  EXPECT_LE(server.connections(), 4u);
}

TEST(Client, MultiTurnReportsTheCachedPrefixOfEachTurn) {
  FakeOpenAiServer server;
  LoadResult result = run(server, closed_loop(2, 8), workload(Scenario::multi_turn, 20, 5));
  ASSERT_EQ(result.records.size(), 8u);  // 2 dialogues x 4 turns
  std::map<size_t, std::vector<RequestRecord>> dialogues;
  for (const auto& r : result.records) {
    ASSERT_TRUE(r.ok) << r.error_cause;
    dialogues[r.conversation].push_back(r);
  }
  ASSERT_EQ(dialogues.size(), 2u);
  for (auto& [id, turns] : dialogues) {
    ASSERT_EQ(turns.size(), 4u);
    for (size_t t = 1; t < turns.size(); ++t) {
      EXPECT_EQ(turns[t].turn, t);
      // The fake caches everything it has seen: the previous prompt, the assistant marker and its 5 tokens.
      EXPECT_EQ(turns[t].cached_tokens, turns[t - 1].prompt_tokens + 1 + 5);
      EXPECT_GT(turns[t].prompt_tokens, turns[t - 1].prompt_tokens + 20);
    }
  }
  for (const auto& s : server.served()) EXPECT_EQ(s.body["messages"].size() % 2, 1u);
  json summary = summarize(result.records, result.duration_s);
  ASSERT_EQ(summary["per_turn"].size(), 4u);
  EXPECT_LT(summary["per_turn"][0]["cached_tokens_ratio"].get<double>(), 0.1);
  EXPECT_GT(summary["per_turn"][3]["cached_tokens_ratio"].get<double>(), 0.6);
}

TEST(Client, ToolCallScenarioAnswersTheModelsToolCall) {
  FakeOpenAiServer server;
  LoadResult result = run(server, closed_loop(1, 4), workload(Scenario::tool_call));
  ASSERT_EQ(result.records.size(), 4u);
  for (const auto& r : result.records) ASSERT_TRUE(r.ok) << r.error_cause << ": " << r.error_message;
  EXPECT_EQ(result.records[0].tool_calls, 1u);
  EXPECT_EQ(result.records[0].finish_reason, "tool_calls");
  EXPECT_EQ(result.records[1].tool_calls, 0u);
  auto served = server.served();
  ASSERT_EQ(served.size(), 4u);
  const json& follow_up = served[1].body;
  ASSERT_TRUE(follow_up.contains("tools"));
  const json& m = follow_up["messages"];
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_fake_0");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris"})");
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "call_fake_0");
  EXPECT_EQ(summarize(result.records, 1)["tool_calls_returned"], 2);
}

TEST(Client, LongGenerationStreamsThousandsOfTokens) {
  FakeOpenAiServer server;
  WorkloadOptions w = workload(Scenario::long_gen);
  w.long_output_len = 3000;
  LoadResult result = run(server, closed_loop(2, 2), w);
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& r : result.records) {
    ASSERT_TRUE(r.ok) << r.error_cause;
    EXPECT_EQ(r.completion_tokens, 3000u);
    EXPECT_EQ(r.chunks, 3000u);
    EXPECT_EQ(r.itl_s.size(), 2999u);
  }
}

TEST(Client, FailuresAreCountedByCause) {
  FakeScript script;
  script.stall_s = 1.0;
  // Each failure lands on a connection the client has not used before or one the server kept open, so
  // no request is retried (see RetriesOnceOnAStaleKeptAliveConnection).
  script.failure = [](size_t n) {
    switch (n) {
      case 0:
        return Failure::http_500;
      case 1:
        return Failure::close_mid_stream;
      case 2:
        return Failure::close_before_headers;
      case 3:
        return Failure::http_429;
      case 4:
        return Failure::error_event;
      case 5:
        return Failure::bad_json;
      case 6:
        return Failure::stall;
      default:
        return Failure::none;
    }
  };
  // The stall outlasts the timeout by far, and the timeout every other request by far, so a loaded machine
  // cannot turn a slow success into a timeout or the stall into a success.
  script.stall_s = 6.0;
  FakeOpenAiServer server(script);
  LoadOptions load = closed_loop(1, 10);
  load.request_timeout_s = 2.0;
  LoadResult result = run(server, load, workload(Scenario::single_turn));
  ASSERT_EQ(result.records.size(), 10u);
  json s = summarize(result.records, result.duration_s);
  EXPECT_EQ(s["completed"], 3) << s.dump(1);
  EXPECT_EQ(s["failed"], 7);
  EXPECT_EQ(s["failures"]["http_500"], 1);
  EXPECT_EQ(s["failures"]["http_429"], 1);
  EXPECT_EQ(s["failures"]["stream_truncated"], 1);
  EXPECT_EQ(s["failures"]["connection_closed"], 1);
  EXPECT_EQ(s["failures"]["stream_error"], 1);
  EXPECT_EQ(s["failures"]["bad_response"], 1);
  EXPECT_EQ(s["failures"]["timeout"], 1);
  EXPECT_EQ(result.records[0].error_message, "scripted failure");
  EXPECT_EQ(result.records[0].http_status, 500);
  EXPECT_EQ(result.records[3].error_message, "too many requests");
  EXPECT_EQ(result.records[4].error_message, "engine failed mid-stream");
  EXPECT_TRUE(result.records[9].ok);
}

TEST(Client, RetriesOnceOnAStaleKeptAliveConnection) {
  FakeScript script;
  script.failure = [](size_t n) { return n == 1 ? Failure::close_before_headers : Failure::none; };
  FakeOpenAiServer server(script);
  LoadResult result = run(server, closed_loop(1, 2), workload(Scenario::single_turn));
  ASSERT_EQ(result.records.size(), 2u);
  EXPECT_TRUE(result.records[0].ok);
  EXPECT_TRUE(result.records[1].ok) << result.records[1].error_cause;
  EXPECT_EQ(server.served().size(), 3u);  // the second request went out twice
  EXPECT_EQ(server.connections(), 2u);
}

TEST(Client, ServerThatClosesEveryConnectionStillWorks) {
  FakeScript script;
  script.close_after_response = true;
  FakeOpenAiServer server(script);
  LoadResult result = run(server, closed_loop(2, 6), workload(Scenario::single_turn));
  for (const auto& r : result.records) EXPECT_TRUE(r.ok) << r.error_cause;
  EXPECT_EQ(server.connections(), 6u);
  EXPECT_EQ(server.served().size(), 6u);
}

TEST(Client, RefusedConnectionsAreFailuresNotCrashes) {
  PromptGenerator prompts(1);
  LoadResult result = run_load(Endpoint::parse("http://127.0.0.1:" + std::to_string(peers::free_port())),
                               closed_loop(2, 4), workload(Scenario::single_turn), prompts);
  ASSERT_EQ(result.records.size(), 4u);
  for (const auto& r : result.records) EXPECT_EQ(r.error_cause, "connect");
}

TEST(Client, RequestRateCapsConcurrency) {
  FakeScript script;
  script.ttft_s = 0.05;
  FakeOpenAiServer server(script);
  LoadOptions load;
  load.request_rate = 1000;  // all arrive at once: only the cap spaces them
  load.concurrency = 2;
  load.num_requests = 8;
  load.seed = 3;
  LoadResult result = run(server, load, workload(Scenario::single_turn));
  ASSERT_EQ(result.records.size(), 8u);
  size_t most = 0;
  for (const auto& a : result.records) {
    ASSERT_TRUE(a.ok);
    size_t overlapping = 0;  // requests in flight at the moment `a` started
    for (const auto& b : result.records)
      overlapping += b.start_s <= a.start_s && a.start_s < b.start_s + b.e2e_s;
    most = std::max(most, overlapping);
  }
  EXPECT_LE(most, 2u);
}

TEST(Client, RequestRateSpreadsArrivals) {
  FakeOpenAiServer server;
  LoadOptions load;
  load.request_rate = 50;
  load.num_requests = 10;
  LoadResult result = run(server, load, workload(Scenario::single_turn));
  ASSERT_EQ(result.records.size(), 10u);
  // Nine exponential gaps with a mean of 20 ms; Poisson arrivals are never all at t=0.
  EXPECT_GT(result.records.back().start_s, result.records.front().start_s);
}

TEST(Client, DurationBoundsTheRun) {
  FakeScript script;
  script.itl_s = 0.01;
  FakeOpenAiServer server(script);
  LoadOptions load;
  load.concurrency = 2;
  load.duration_s = 0.4;
  LoadResult result = run(server, load, workload(Scenario::single_turn));
  // Counts, not clocks: each slot starts a request at once, and a reply of 6 tokens takes the server at least
  // 5 x 10 ms, so a slot can start at most 0.4 / 0.05 = 8 requests before the bound (one more for rounding at
  // the edge). A client that ignored the bound would run on until the default request count.
  EXPECT_GE(result.records.size(), 2u);
  EXPECT_LE(result.records.size(), 2u * 9);
  for (const auto& r : result.records) EXPECT_TRUE(r.ok) << r.error_cause;
}

TEST(Benchmark, SweepRecordsServerAndOneRunPerConcurrency) {
  FakeOpenAiServer server;
  BenchConfig config;
  config.url = server.url() + "/v1";
  config.scenarios = {Scenario::single_turn, Scenario::multi_turn};
  config.concurrencies = {1, 2, 4};
  config.load.num_requests = 8;
  config.workload = workload(Scenario::single_turn);
  config.workload.model.clear();  // ask /v1/models
  PromptGenerator prompts(5);
  size_t callbacks = 0;
  json doc = run_benchmark(config, prompts, [&](const json&, const json&) { ++callbacks; });
  EXPECT_EQ(callbacks, 6u);
  EXPECT_EQ(doc["server"]["version"]["version"], "fake-1.0");
  EXPECT_EQ(doc["config"]["model"], "fake-model");
  EXPECT_NE(doc["label"].get<std::string>().find("fake-1.0"), std::string::npos);
  ASSERT_EQ(doc["runs"].size(), 6u);
  EXPECT_EQ(doc["runs"][2]["concurrency"], 4);
  EXPECT_EQ(doc["runs"][3]["scenario"], "multi_turn");
  for (const json& r : doc["runs"]) {
    EXPECT_EQ(r["summary"]["failed"], 0);
    EXPECT_EQ(r["requests"].size(), 8u);
  }
  // 48 measured requests, after one probe that checked ignore_eos/min_tokens are accepted.
  auto served = server.served();
  ASSERT_EQ(served.size(), 49u);
  EXPECT_EQ(served[0].body["max_tokens"], 1);
  EXPECT_EQ(served[0].body["ignore_eos"], true);
  EXPECT_TRUE(doc["config"]["ignore_eos"].get<bool>());
  for (size_t i = 1; i < served.size(); ++i) EXPECT_EQ(served[i].body["ignore_eos"], true);
}

TEST(Benchmark, ServerThatRefusesIgnoreEosIsBenchmarkedWithoutIt) {
  FakeScript script;
  script.rejected_fields = {"ignore_eos", "min_tokens"};
  FakeOpenAiServer server(script);
  BenchConfig config;
  config.url = server.url();
  config.scenarios = {Scenario::single_turn};
  config.concurrencies = {2};
  config.load.num_requests = 6;
  config.workload = workload(Scenario::single_turn, 24, 8);
  PromptGenerator prompts(5);
  json doc = run_benchmark(config, prompts, {});
  EXPECT_FALSE(doc["config"]["ignore_eos"].get<bool>());
  ASSERT_EQ(doc["runs"].size(), 1u);
  EXPECT_EQ(doc["runs"][0]["summary"]["failed"], 0) << doc["runs"][0]["summary"].dump(1);
  auto served = server.served();
  ASSERT_EQ(served.size(), 2u + 6u);  // the refused probe, the probe without the fields, the run
  EXPECT_TRUE(served[0].body.contains("ignore_eos"));
  for (size_t i = 1; i < served.size(); ++i) {
    EXPECT_FALSE(served[i].body.contains("ignore_eos"));
    EXPECT_FALSE(served[i].body.contains("min_tokens"));
  }
  // Without them the fake stops at its natural length (5 < 8): the lengths are the server's, and the
  // records say none was asked to be exact.
  for (const json& r : doc["runs"][0]["requests"]) {
    EXPECT_EQ(r["completion_tokens"], 5);
    EXPECT_FALSE(r["exact_output"].get<bool>());
  }
}

// `moeserve route` in front of the fake: the bench works through a real streaming proxy, and what it measures
// (usage, cached tokens, per-turn history, failures) passes through.
std::string run_command(const std::string& args, int* status = nullptr);

// A `moeserve` subcommand run as a child process (output in TempDir()/log), killed at the end of the test.
peers::ChildProcess start_moeserve(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), MOESERVE_BINARY);
  return peers::ChildProcess(std::move(args), {.log_path = ::testing::TempDir() + log});
}

TEST(Command, BenchThroughTheRouter) {
  FakeScript script;
  script.failure = [](size_t n) { return n == 5 ? Failure::http_503 : Failure::none; };
  FakeOpenAiServer server(script);
  uint16_t port = peers::free_port();
  peers::ChildProcess router =
      start_moeserve({"route", "--host", "127.0.0.1", "--port", std::to_string(port), "--workers", "1",
                      "--health-interval", "0", "--backend", server.url()},
                     "bench-router.log");
  Endpoint endpoint = Endpoint::parse("http://127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(peers::wait_http_ok(port, "/health", &router, std::chrono::seconds(20)))
      << "moeserve route did not come up:\n"
      << router.output();
  PromptGenerator prompts(2);
  LoadResult result = run_load(endpoint, closed_loop(1, 8), workload(Scenario::multi_turn, 20, 5), prompts);
  ASSERT_EQ(result.records.size(), 6u);  // the 503 on turn 2 of the second dialogue ends it
  json s = summarize(result.records, result.duration_s);
  EXPECT_EQ(s["completed"], 5) << s.dump(1);
  EXPECT_EQ(s["failures"]["http_503"], 1);
  for (size_t t = 1; t < 4; ++t) {
    EXPECT_EQ(result.records[t].cached_tokens, result.records[t - 1].prompt_tokens + 1 + 5);
    EXPECT_EQ(result.records[t].completion_tokens, 5u);
  }
}

// The real thing: `moeserve serve --model demo` (random weights, the Qwen3 vocabulary) under all four
// scenarios, with token-exact prompts. Checks what a real server reports, not how fast it is.
TEST(Command, AllScenariosAgainstMoeserveServe) {
  uint16_t port = peers::free_port();
  peers::ChildProcess serve = start_moeserve(
      {"serve", "--model", "demo", "--host", "127.0.0.1", "--port", std::to_string(port)}, "bench-serve.log");
  std::string url = "http://127.0.0.1:" + std::to_string(port);
  ASSERT_TRUE(peers::wait_http_ok(port, "/health", &serve, std::chrono::seconds(300)))
      << "moeserve serve --model demo did not come up:\n"
      << serve.output();
  std::string out = ::testing::TempDir() + "bench-serve.json";
  int rc = 0;
  std::string text =
      run_command("bench --url " + url +
                      " --scenario all --num-requests 6 --concurrency 2 --input-len 32 --output-len 8 "
                      "--long-output-len 96 --turns 3 --tokenizer .cache/tokenizer-qwen3 --quiet "
                      "--output " +
                      out,
                  &rc);
  ASSERT_EQ(rc, 0) << text;
  json doc = json::parse(std::ifstream(out));
  EXPECT_EQ(doc["config"]["model"], "moeserve-demo");
  EXPECT_TRUE(doc["config"]["exact_input_lengths"].get<bool>());
  EXPECT_FALSE(doc["server"]["version"].is_null());
  ASSERT_EQ(doc["runs"].size(), 4u);
  for (const json& run : doc["runs"]) {
    const json& s = run["summary"];
    SCOPED_TRACE(run["scenario"].get<std::string>());
    EXPECT_EQ(s["failed"], 0) << s["failure_examples"].dump();
    EXPECT_GT(s["completed"].get<int>(), 0);
    EXPECT_DOUBLE_EQ(s["exact_output_ratio"].get<double>(), 1.0);  // ignore_eos + min_tokens honoured
    for (const json& r : run["requests"]) {
      EXPECT_TRUE(r["usage_reported"].get<bool>());
      if (r["turn"] == 0) {
        EXPECT_GT(r["prompt_tokens"].get<int>(), 32);  // the chat template adds tokens
      }
    }
  }
  EXPECT_EQ(doc["runs"][3]["requests"][0]["completion_tokens"], 96);
  // Dialogues: each turn's prompt extends the previous one, so the prefix cache can serve part of it.
  const json& turns = doc["runs"][1]["summary"]["per_turn"];
  ASSERT_EQ(turns.size(), 3u);
  EXPECT_GT(turns[2]["prompt_tokens_mean"].get<double>(), turns[1]["prompt_tokens_mean"].get<double>() + 32);
  EXPECT_GT(turns[2]["cached_tokens_ratio"].get<double>(), 0.0);
}

// The image scenario against `moeserve serve --model demo` (its random tower, the Qwen3.5 chat template that
// writes image parts): every request's two pictures reach the tower (the prompt holds their image tokens,
// /metrics counts them encoded) and none is in the prefix cache (each picture is new).
TEST(Command, ImageScenarioAgainstMoeserveServe) {
  uint16_t port = peers::free_port();
  peers::ChildProcess serve = start_moeserve(
      {"serve", "--model", "demo", "--host", "127.0.0.1", "--port", std::to_string(port), "--cache-memory-gb",
       "0.0625", "--chat-template", "tests/fixtures/chat-templates/qwen3_5.jinja"},
      "bench-image-serve.log");
  std::string url = "http://127.0.0.1:" + std::to_string(port);
  ASSERT_TRUE(peers::wait_http_ok(port, "/health", &serve, std::chrono::seconds(300)))
      << "moeserve serve --model demo did not come up:\n"
      << serve.output();
  std::string out = ::testing::TempDir() + "bench-image.json";
  int rc = 0;
  std::string text = run_command("bench --url " + url +
                                     " --scenario image --images-per-request 2 --image-size 96x64 "
                                     "--image-format jpeg --num-requests 4 --concurrency 2 --input-len 16 "
                                     "--output-len 4 --tokenizer .cache/tokenizer-qwen3 --quiet --output " +
                                     out,
                                 &rc);
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("Image throughput (images/s):"), std::string::npos) << text;
  json doc = json::parse(std::ifstream(out));
  EXPECT_EQ(doc["config"]["images_per_request"], 2);
  EXPECT_EQ(doc["config"]["image_size"], "96x64");
  EXPECT_EQ(doc["config"]["image_format"], "jpeg");
  ASSERT_EQ(doc["runs"].size(), 1u);
  const json& s = doc["runs"][0]["summary"];
  EXPECT_EQ(s["failed"], 0) << s["failure_examples"].dump();
  EXPECT_EQ(s["completed"], 4);
  EXPECT_EQ(s["total_images"], 8);
  EXPECT_GT(s["image_throughput"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(s["exact_output_ratio"].get<double>(), 1.0);
  // smart_resize brings a 96x64 picture up to the processor's 65,536 pixels: at least 64 tokens each.
  for (const json& r : doc["runs"][0]["requests"]) {
    EXPECT_EQ(r["images"], 2);
    EXPECT_GT(r["prompt_tokens"].get<int>(), 16 + 2 * 64) << r.dump();
    EXPECT_LT(r["cached_tokens"].get<int>(), 16) << r.dump();
  }
  std::string metrics = http_get(Endpoint::parse(url), "/metrics", "", 10).body;
  size_t at = metrics.find("\nmoeserve:image_encoded_total");
  ASSERT_NE(at, std::string::npos) << metrics;
  std::string line = metrics.substr(at + 1, metrics.find('\n', at + 1) - at - 1);
  EXPECT_EQ(std::stod(line.substr(line.rfind(' ') + 1)), 8) << line;
}

// --- the command line ---------------------------------------------------------------------------

// The moeserve binary with `args`: its output (stdout and stderr), the exit code in *status.
std::string run_command(const std::string& args, int* status) {
  peers::CommandResult r = peers::run_command(std::string(MOESERVE_BINARY) + " " + args);
  if (status) *status = r.status;
  return r.output;
}

TEST(Command, AllScenariosThenCompare) {
  FakeScript script;
  script.itl_s = 0.001;
  FakeOpenAiServer server(script);
  std::string dir = ::testing::TempDir();
  int rc = 0;
  std::string common =
      " --scenario all --num-requests 8 --concurrency 2 --input-len 16 --output-len 4 "
      "--long-output-len 64 --turns 4 --quiet --url " +
      server.url();
  std::string a = run_command(
      "bench" + common + " --label first --output " + dir + "a.json --plot " + dir + "a.svg", &rc);
  ASSERT_EQ(rc, 0) << a;
  EXPECT_NE(a.find("single_turn"), std::string::npos) << a;
  EXPECT_NE(a.find("Per turn"), std::string::npos) << a;
  std::string b =
      run_command("bench" + common + " --sweep 1,2 --label second --output " + dir + "b.json", &rc);
  ASSERT_EQ(rc, 0) << b;

  json doc = json::parse(std::ifstream(dir + "a.json"));
  EXPECT_EQ(doc["label"], "first");
  ASSERT_EQ(doc["runs"].size(), 4u);
  EXPECT_EQ(doc["runs"][3]["scenario"], "long_gen");
  EXPECT_EQ(doc["runs"][3]["requests"][0]["completion_tokens"], 64);
  EXPECT_EQ(doc["server"]["version"]["version"], "fake-1.0");
  EXPECT_EQ(std::system(("xmllint --noout " + dir + "a.svg").c_str()), 0);

  std::string table = run_command("bench compare " + dir + "a.json " + dir + "b.json", &rc);
  ASSERT_EQ(rc, 0) << table;
  EXPECT_NE(table.find("diff %"), std::string::npos) << table;
  EXPECT_NE(table.find("first"), std::string::npos);
  EXPECT_NE(table.find("second"), std::string::npos);
  EXPECT_NE(table.find("tool_call"), std::string::npos);

  std::string plot = run_command("bench plot " + dir + "b.json --out " + dir + "b.svg", &rc);
  ASSERT_EQ(rc, 0) << plot;
  EXPECT_EQ(std::system(("xmllint --noout " + dir + "b.svg").c_str()), 0);
}

TEST(Command, MistakesGetAClearMessage) {
  int rc = 0;
  std::string out = run_command("bench --scenario single_turn", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--url"), std::string::npos) << out;
  out = run_command("bench --url http://127.0.0.1:1 --scenario chat", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("unknown scenario"), std::string::npos) << out;
  out = run_command("bench --url http://127.0.0.1:1 --sweep 1,x", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--sweep"), std::string::npos) << out;
}

}  // namespace
}  // namespace moeserve::loadgen
