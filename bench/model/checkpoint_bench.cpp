// Checkpoint loading: mapping + header validation + assembly of the fixtures, header parsing at the tensor
// count of a per-expert 35B checkpoint, and building 35b-a3b-shaped dummy weights in memory.
//   build/bench/model_bench                                   (the fast ones)
//   build/bench/model_bench --benchmark_filter=Dummy          (a 4-layer 35b-a3b slice: 8.8 GB BF16, 5.4 GB
//   FP8)
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/safetensors.h"

namespace moeserve {
namespace {

const std::string kFixtures = std::string(MOESERVE_SOURCE_DIR) + "/tests/fixtures/models/";

void load(benchmark::State& state, const std::string& name) {
  spdlog::set_level(spdlog::level::warn);  // one "loaded ..." line per iteration would drown the table
  for (auto _ : state) {
    ModelWeights w = load_checkpoint(kFixtures + name);
    benchmark::DoNotOptimize(w.embed.data);
  }
}
void BM_LoadSmallMoeRealdims(benchmark::State& state) {
  load(state, "small-moe-realdims");
}
void BM_LoadSmallMoeRealdimsFp8(benchmark::State& state) {
  load(state, "small-moe-realdims-fp8");
}
void BM_LoadTinyMoe(benchmark::State& state) {
  load(state, "tiny-moe");
}

// A header naming `tensors` one-element BF16 tensors (a per-expert FP8 35B-A3B checkpoint has ~63k).
void BM_ParseHeader(benchmark::State& state) {
  size_t n = size_t(state.range(0));
  nlohmann::json h = nlohmann::json::object();
  for (size_t i = 0; i < n; ++i)
    h[fmt::format("model.layers.{}.mlp.experts.{}.gate_proj.weight", i / 768, i % 768)] = {
        {"dtype", "BF16"}, {"shape", {1}}, {"data_offsets", {2 * i, 2 * i + 2}}};
  std::string text = h.dump();
  std::vector<uint8_t> file(8 + text.size() + 2 * n);
  for (int i = 0; i < 8; ++i) file[size_t(i)] = uint8_t(uint64_t(text.size()) >> (8 * i));
  std::copy(text.begin(), text.end(), file.begin() + 8);
  for (auto _ : state) {
    auto header = parse_safetensors(file, "bench");
    benchmark::DoNotOptimize(header.tensors.data());
  }
  state.counters["header_MB"] = double(text.size()) / 1e6;
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
}

void dummy(benchmark::State& state, DType dtype) {
  ModelConfig config = preset_config("35b-a3b", 4);
  for (auto _ : state) {
    ModelWeights w = make_dummy_weights(config, 0, dtype);
    benchmark::DoNotOptimize(w.embed.data);
  }
}
void BM_Dummy35bA3b4LayersBf16(benchmark::State& state) {
  dummy(state, DType::BF16);
}
void BM_Dummy35bA3b4LayersFp8(benchmark::State& state) {
  dummy(state, DType::F8_E4M3);
}

BENCHMARK(BM_LoadTinyMoe)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadSmallMoeRealdims)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadSmallMoeRealdimsFp8)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseHeader)->Arg(1000)->Arg(63000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Dummy35bA3b4LayersBf16)->Iterations(1)->Unit(benchmark::kSecond);
BENCHMARK(BM_Dummy35bA3b4LayersFp8)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
