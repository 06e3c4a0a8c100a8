#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace moeserve {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {1u, 3u, 4u, 5u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, NestedCallsRunSeriallyInsteadOfDeadlocking) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  pool.parallel_for(6, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](size_t b2, size_t e2) { total += int(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 60);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep)
        pool.parallel_for(100, [&](size_t b, size_t e) { sum += long(e - b); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 50 * 100);
}

}  // namespace
}  // namespace moeserve
