// Vision tower throughput with random weights: images/s and patches/s for square images of the given sides,
// one image per encode and a batch of --batch images, on the CPU or CUDA backend. --tower release is
// Qwen3.5-35B-A3B's tower (27 blocks of 1152, 16 heads of 72, 2048 out); --tower small the fixture's. The
// times include the host's share of an encode (preprocessed patches in, position and rotary tables made on
// the host, merged features back); --profile (CUDA) then prints each op's GPU time over one more encode.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>

#include "backend/backend.h"
#include "common/dtype.h"
#include "table_bench.h"
#include "vision/tower.h"
#ifdef MOESERVE_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {
namespace {

struct Options {
  std::string device = "cpu";
  std::string tower = "release";
  std::vector<int> sides = {448, 1024};
  int batch = 4;
  int repeats = 3;
  std::string matmul = "bf16";
  bool profile = false;
};

// Random weights at unit activation scale: matrices ~U(±sqrt(3/cols)), norms 1, biases and positions small.
struct RandomTower {
  VisionWeights w;
  std::vector<std::vector<uint16_t>> matrices;

  RandomTower(const VisionConfig& c) {
    w.config = c;
    std::mt19937 rng(1);
    auto vec = [&](int64_t n, float scale, float offset) {
      std::uniform_real_distribution<float> u(-scale, scale);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = offset + u(rng);
      return v;
    };
    auto mat = [&](int64_t rows, int64_t cols) {
      std::uniform_real_distribution<float> u(-std::sqrt(3.0f / float(cols)), std::sqrt(3.0f / float(cols)));
      matrices.emplace_back(static_cast<size_t>(rows * cols));
      for (auto& x : matrices.back()) x = f32_to_bf16(u(rng));
      Matrix m;
      m.dtype = DType::BF16, m.rows = rows, m.cols = cols, m.data = matrices.back().data();
      return m;
    };
    const int64_t h = c.hidden_size, f = c.intermediate_size, m = 4 * h;
    matrices.reserve(size_t(4 * c.depth + 3));
    w.patch_embed = mat(h, c.patch_columns());
    w.patch_embed_b = vec(h, 0.02f, 0);
    w.pos_embed = vec(int64_t(c.num_position_embeddings) * h, 1.0f, 0);
    for (int i = 0; i < c.depth; ++i) {
      VisionBlockWeights b;
      b.norm1_w = vec(h, 0.1f, 1), b.norm1_b = vec(h, 0.02f, 0);
      b.norm2_w = vec(h, 0.1f, 1), b.norm2_b = vec(h, 0.02f, 0);
      b.qkv = mat(3 * h, h), b.qkv_b = vec(3 * h, 0.02f, 0);
      b.proj = mat(h, h), b.proj_b = vec(h, 0.02f, 0);
      b.fc1 = mat(f, h), b.fc1_b = vec(f, 0.02f, 0);
      b.fc2 = mat(h, f), b.fc2_b = vec(h, 0.02f, 0);
      w.blocks.push_back(std::move(b));
    }
    w.merger_norm_w = vec(h, 0.1f, 1), w.merger_norm_b = vec(h, 0.02f, 0);
    w.merger_fc1 = mat(m, m), w.merger_fc1_b = vec(m, 0.02f, 0);
    w.merger_fc2 = mat(c.out_hidden_size, m), w.merger_fc2_b = vec(c.out_hidden_size, 0.02f, 0);
  }
};

VisionConfig tower_config(const std::string& name) {
  VisionConfig c;
  if (name == "small") {
    c.depth = 2, c.hidden_size = 64, c.intermediate_size = 128, c.num_heads = 2, c.out_hidden_size = 64;
    c.num_position_embeddings = 64;
  } else {
    c.depth = 27, c.hidden_size = 1152, c.intermediate_size = 4304, c.num_heads = 16,
    c.out_hidden_size = 2048;
    c.num_position_embeddings = 2304;
  }
  return c;
}

int run(const Options& o) {
  auto backend = make_backend(o.device, {.fp32_matmul = o.matmul == "fp32"});
  RandomTower random(tower_config(o.tower));
  VisionTower tower(random.w, *backend);
  ImageProcessorConfig processor;
  std::printf("%s tower (%d blocks of %d, %d heads) on %s%s\n", o.tower.c_str(), random.w.config.depth,
              random.w.config.hidden_size, random.w.config.num_heads, backend->name(),
              o.device == "cuda" ? (o.matmul == "fp32" ? ", float32 matmuls" : ", bf16 tensor cores") : "");
#ifdef MOESERVE_HAS_CUDA
  if (o.device == "cuda") std::printf("%s\n", cuda_tools::device_summary(*backend).c_str());
#endif
  std::printf("%8s %6s %9s %10s %12s\n", "side", "batch", "patches", "images/s", "patches/s");
  for (int side : o.sides) {
    Image img{side, side, std::vector<uint8_t>(size_t(side) * size_t(side) * 3)};
    for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = uint8_t((i * 2654435761u) >> 24);
    ImagePatches patches = preprocess_image(img, processor);
    for (int batch : {1, o.batch}) {
      std::vector<const ImagePatches*> images(size_t(batch), &patches);
      tower.encode(images);  // warm-up: weights where the backend runs, buffers allocated
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < o.repeats; ++r) tower.encode(images);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.repeats;
      std::printf("%8d %6d %9lld %10.2f %12.0f\n", side, batch, (long long)patches.patches(), batch / s,
                  double(batch * patches.patches()) / s);
#ifdef MOESERVE_HAS_CUDA
      if (o.profile && o.device == "cuda") {
        cuda_tools::reset_profile(*backend);
        cuda_tools::set_profiling(*backend, true);
        tower.encode(images);
        cuda_tools::set_profiling(*backend, false);
        std::printf("%s", cuda_tools::profile_report(*backend).c_str());
      }
#endif
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  moeserve::Options o;
  CLI::App app{"vision tower throughput"};
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--tower", o.tower, "release or small")->check(CLI::IsMember({"release", "small"}));
  app.add_option("--sides", o.sides, "square image sides (pixels)");
  app.add_option("--batch", o.batch, "images per encode of the batched run")->check(CLI::PositiveNumber);
  app.add_option("--repeats", o.repeats, "timed encodes per row")->check(CLI::PositiveNumber);
  app.add_option("--matmul", o.matmul, "CUDA precision: bf16 (tensor cores) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_flag("--profile", o.profile, "CUDA: each op's GPU time over one more encode per row");
  return moeserve::bench::run_table_bench(app, argc, argv, [&] { return moeserve::run(o); });
}
