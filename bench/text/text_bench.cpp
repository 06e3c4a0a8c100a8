// Tokenizer and chat-template throughput on a deterministic few-MB mix of English, Chinese and code.
// Run: build/bench/text_bench (needs .cache/tokenizer-qwen3 from scripts/fetch-test-data.sh).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

using moeserve::text::Tokenizer;

// The source tree (for .cache/ and tests/fixtures/); $MOESERVE_SOURCE_DIR overrides the build-time path.
const std::string kRoot =
    std::getenv("MOESERVE_SOURCE_DIR") ? std::getenv("MOESERVE_SOURCE_DIR") : MOESERVE_SOURCE_DIR;

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_file(kRoot + "/.cache/tokenizer-qwen3/tokenizer.json");
  return t;
}

// ~4 MB: prose paragraphs, Chinese sentences and code in a fixed pseudo-random order (same every run).
const std::string& corpus() {
  static const std::string text = [] {
    const char* english[] = {"the",     "model",       "serves",  "requests",   "with",   "a",
                             "mixture", "of",          "experts", "and",        "caches", "prefixes",
                             "so",      "that",        "latency", "stays",      "low",    "when",
                             "traffic", "grows",       "quickly", "Tokenizers", "don't",  "it's",
                             "we'll",   "performance", "2026",    "3.14",       "GPU",    "throughput"};
    const char* chinese[] = {"模型", "推理", "服务", "缓存", "专家", "混合", "延迟", "吞吐量",
                             "请求", "部署", "集群", "你好", "世界", "高效", "并行", "计算"};
    const char* code[] = {"def f(x):\n    return x ** 2  # square\n",
                          "for (int i = 0; i < n; ++i) {\n  sum += a[i] * b[i];\n}\n",
                          "const result = await fetch(`/v1/chat/completions`, {method: 'POST'});\n",
                          "if err != nil {\n\treturn fmt.Errorf(\"load %s: %w\", path, err)\n}\n",
                          "    self.cache[key] = value\n",
                          "#include <vector>\nstd::vector<float> v(1024);\n"};
    uint64_t s = 42;
    auto next = [&](uint64_t n) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return (s >> 33) % n;
    };
    std::string out;
    while (out.size() < (4u << 20)) {
      switch (next(3)) {
        case 0:
          for (int w = 0, n = 20 + static_cast<int>(next(40)); w < n; ++w) {
            out += english[next(std::size(english))];
            out += next(12) == 0 ? ", " : " ";
          }
          out += ".\n\n";
          break;
        case 1:
          for (int w = 0, n = 10 + static_cast<int>(next(30)); w < n; ++w) {
            out += chinese[next(std::size(chinese))];
            if (next(8) == 0) out += "，";
          }
          out += "。\n";
          break;
        default:
          for (int w = 0, n = 1 + static_cast<int>(next(4)); w < n; ++w) out += code[next(std::size(code))];
      }
    }
    return out;
  }();
  return text;
}

void BM_EncodeSingleThread(benchmark::State& state) {
  const std::string& text = corpus();
  tokenizer().encode(text.substr(0, 1 << 16));  // load outside the timing
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tokenizer().encode(text);
    tokens += ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["bytes/token"] =
      static_cast<double>(text.size() * state.iterations()) / static_cast<double>(tokens);
}
BENCHMARK(BM_EncodeSingleThread)->Unit(benchmark::kMillisecond)->UseRealTime();

// Text never seen before: each iteration encodes on a new thread, whose per-thread word cache starts empty
// (the thread start is microseconds against a ~100 ms encode). Wall time only: the work is off the main
// thread.
void BM_EncodeSingleThreadColdCache(benchmark::State& state) {
  const std::string& text = corpus();
  tokenizer().encode(text.substr(0, 1 << 16));
  size_t tokens = 0;
  for (auto _ : state) {
    std::thread([&] { tokens += tokenizer().encode(text).size(); }).join();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeSingleThreadColdCache)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_EncodeBatchThreadPool(benchmark::State& state) {
  const std::string& text = corpus();
  std::vector<std::string> docs;
  for (size_t i = 0; i < text.size(); i += 16384) docs.push_back(text.substr(i, 16384));
  tokenizer().encode(docs[0]);
  size_t tokens = 0;
  for (auto _ : state) {
    auto out = tokenizer().encode_batch(docs);
    for (const auto& ids : out) tokens += ids.size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["threads"] = static_cast<double>(moeserve::ThreadPool::global().size());
}
BENCHMARK(BM_EncodeBatchThreadPool)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DecodeStreaming(benchmark::State& state) {
  static const std::vector<int32_t> ids = tokenizer().encode(corpus().substr(0, 1 << 20));
  for (auto _ : state) {
    moeserve::text::IncrementalDetokenizer d(tokenizer());
    size_t bytes = 0;
    for (int32_t id : ids) bytes += d.push(id).size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(ids.size() * state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeStreaming)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RenderQwen35ToolsConversation(benchmark::State& state) {
  std::ifstream in(kRoot + "/tests/fixtures/chat-templates/qwen3_5.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  moeserve::text::ChatTemplate t(ss.str());
  std::ifstream g(kRoot + "/tests/fixtures/goldens/chat-template-goldens.json");
  auto goldens = nlohmann::ordered_json::parse(g);
  const auto& c = goldens["cases"][5];  // tools_call_and_response
  for (auto _ : state) benchmark::DoNotOptimize(t.render(c["messages"], c["tools"]));
}
BENCHMARK(BM_RenderQwen35ToolsConversation)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
