// Run under mpirun (tests/dist/CMakeLists.txt): every rank computes the fixtures' reference prompts with the
// weights sharded over the MPI world and, on its own, unsharded (TP=1), and checks that logits agree within
// float rounding and greedy tokens are equal. Every rank makes the same collective calls in the same order,
// so a failed expectation on one rank never leaves the others waiting.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "common/error.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/tp_runner.h"
#include "model/checkpoint.h"
#include "model/qwen35.h"
#include "model/safetensors.h"
#include "model/sequence.h"
#include "model/tensor_parallel.h"

namespace moeserve {
namespace {

dist::Communicator* world = nullptr;

// Logits of random-weight fixtures are O(1); TP changes only the order of float32 sums.
constexpr double kTolerance = 2e-4;

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

std::vector<int32_t> ids(const TensorSet& ref, const std::string& name) {
  const TensorInfo* t = ref.find(name);
  if (!t) fail("reference: missing {}", name);
  std::vector<int32_t> out(size_t(t->shape[0]));
  for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(reinterpret_cast<const int64_t*>(t->data)[i]);
  return out;
}

struct Models {
  ModelWeights full, shard;
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Qwen35Model> tp1, tpn;
  explicit Models(const std::string& dir)
      : full(load_checkpoint(dir)), shard(shard_weights(full, world->rank(), world->size())) {
    tp1 = std::make_unique<Qwen35Model>(full, *backend);
    tpn = std::make_unique<Qwen35Model>(shard, *backend, world);
  }
};

void check_fixture(const std::string& name) {
  const std::string dir = "tests/fixtures/models/" + name;
  Models m(dir);
  auto ref = TensorSet::open_file(dir + "/reference.safetensors");
  world->reset_stats();
  for (int i = 0; ref.find(fmt::format("prompt{}.input_ids", i)); ++i) {
    auto prompt = ids(ref, fmt::format("prompt{}.input_ids", i));
    SequenceRunner a(*m.tp1, int64_t(prompt.size())), b(*m.tpn, int64_t(prompt.size()));
    auto la = a.prefill(prompt, true).logits, lb = b.prefill(prompt, true).logits;
    EXPECT_LE(max_abs_diff(la, lb), kTolerance) << name << " prompt" << i << " on rank " << world->rank();
  }
  for (int i = 0; ref.find(fmt::format("gen{}.input_ids", i)); ++i) {
    auto prompt = ids(ref, fmt::format("gen{}.input_ids", i));
    const int steps = int(ids(ref, fmt::format("gen{}.output_ids", i)).size());
    SequenceRunner a(*m.tp1, int64_t(prompt.size()) + steps), b(*m.tpn, int64_t(prompt.size()) + steps);
    std::vector<std::vector<float>> la, lb;
    auto ta = a.generate_greedy(prompt, steps, {}, &la);
    auto tb = b.generate_greedy(prompt, steps, {}, &lb);
    EXPECT_EQ(ta, tb) << name << " gen" << i << " greedy tokens on rank " << world->rank();
    for (size_t s = 0; s < std::min(la.size(), lb.size()); ++s)
      EXPECT_LE(max_abs_diff(la[s], lb[s]), kTolerance) << name << " gen" << i << " step " << s;
  }
  // One all-reduce per row-parallel layer output (mixer and feed-forward) plus the embedding's, per step.
  EXPECT_GT(world->stats().all_reduce_calls, 0u);
}

// Two sequences of different lengths in one step, one decoding after a prefill: the batched path.
TEST(TensorParallel, BatchedStepMatchesSingleRank) {
  Models m("tests/fixtures/models/tiny-moe");
  auto run = [&](const Qwen35Model& model) {
    KvCache kv(model.kv_cache_spec(16, 8));
    StateCache state(model.state_cache_spec(2));
    std::vector<int32_t> pa{0, 1, 2, 3}, pb{4, 5, 6, 7, 8, 9, 10};
    std::vector<int32_t> pages_a{0, 1, 2, 3}, pages_b{4, 5, 6, 7};
    std::vector<float> all;
    SequenceStep first[] = {{pa, 0, pages_a, 0, true}, {pb, 0, pages_b, 1, false}};
    auto out = model.forward(first, kv, state);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    int32_t next_a = 11, next_b = 12;
    SequenceStep second[] = {{{&next_a, 1}, 4, pages_a, 0, false}, {{&next_b, 1}, 7, pages_b, 1, false}};
    out = model.forward(second, kv, state);
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    return all;
  };
  auto a = run(*m.tp1), b = run(*m.tpn);
  EXPECT_EQ(a.size(), size_t((4 + 1 + 2) * m.full.config.vocab_size));
  EXPECT_LE(max_abs_diff(a, b), kTolerance);
}

TEST(TensorParallel, TinyMoe) {
  check_fixture("tiny-moe");
}
TEST(TensorParallel, TinyDense) {
  check_fixture("tiny-dense");
}

// Two attention heads and one KV head: two ranks replicate the KV head; four cannot split the heads.
TEST(TensorParallel, SmallMoeRealDims) {
  if (world->size() <= 2) return check_fixture("small-moe-realdims");
  auto full = load_checkpoint("tests/fixtures/models/small-moe-realdims");
  try {
    shard_weights(full, world->rank(), world->size());
    ADD_FAILURE() << "sharding 2 attention heads over " << world->size() << " ranks did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 attention heads do not split evenly"), std::string::npos)
        << e.what();
  }
}

// Block-scaled FP8: cuts on block edges keep FP8, the 64-wide expert slices are widened.
TEST(TensorParallel, SmallMoeRealDimsFp8) {
  if (world->size() <= 2) check_fixture("small-moe-realdims-fp8");
}

// Serving: rank 0's engine batches 6 concurrent greedy requests (prefill chunks, decode, page tables, slot
// reuse); the other ranks follow its steps. Tokens equal those of a single-rank engine.
TEST(TensorParallel, FollowersRunRankZerosEngineSteps) {
  Models m("tests/fixtures/models/tiny-moe");
  EngineOptions o;
  o.cache_memory_bytes = 4 << 20;
  o.max_running_requests = 4;  // 6 requests: two wait, then reuse slots and pages
  o.chunked_prefill_size = 16;
  o.max_model_len = 256;
  o.enable_prefix_cache = false;
  if (world->rank() != 0) {
    EXPECT_GT(run_tp_follower(m.shard, *m.backend, *world), 0);
    return;
  }
  auto run = [&](std::unique_ptr<Engine> engine) {
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < 5 + 9 * i; ++t) prompt.push_back((t * 31 + i * 7) % 512);
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = 12;
      p.ignore_eos = true;
      auto stream = std::make_shared<OutputStream>();
      GenerateRequest r{
          .id = fmt::format("r{}", i), .prompt = prompt, .params = p, .on_output = stream->sink()};
      engine->submit(std::move(r));
      streams.push_back(stream);
    }
    std::vector<std::vector<int32_t>> tokens;
    for (auto& s : streams) tokens.push_back(s->collect().tokens);
    return tokens;
  };
  auto tp = run(Engine::create(make_tp_leader_runner(m.shard, *m.backend, *world), o));
  auto single = run(Engine::create(m.full, o));
  EXPECT_EQ(tp, single);
  EXPECT_EQ(tp[5].size(), 12u);
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!moeserve::dist::launched_by_mpirun()) {
    std::fprintf(stderr, "tp_equivalence_test runs under mpirun -np N (N = 2 or 4)\n");
    return 2;
  }
  auto comm = moeserve::dist::open_group({.tp = std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE"))});
  moeserve::world = comm.get();
  // Only rank 0 prints the progress; every rank's failures still print and fail the run.
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  comm->barrier();
  return rc;
}
