#pragma once
// Timing helpers for the CUDA benchmarks: a body is recorded once as a CUDA graph (run_step) and its replays
// are timed, so launch overhead stays out of per-kernel figures; the median of several timed batches is used.

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace moeserve::bench {

// Seconds per call of `body` (which issues `reps` repetitions of the work being measured).
inline double time_replays(Backend& be, const std::function<void()>& body, int reps, uint64_t key,
                           int batches = 5, int replays_per_batch = 3) {
  for (int i = 0; i < 3; ++i) be.run_step(key, body);  // measure, record, first replay
  std::vector<double> samples;
  for (int b = 0; b < batches; ++b) {
    cuda_tools::synchronize(be);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < replays_per_batch; ++r) be.run_step(key, body);
    cuda_tools::synchronize(be);
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      (replays_per_batch * reps));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Seconds per call of `fn`, run directly (no graph): median over `runs` after one warm-up.
inline double time_direct(Backend& be, const std::function<void()>& fn, int runs = 3) {
  fn();
  cuda_tools::synchronize(be);
  std::vector<double> samples;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    cuda_tools::synchronize(be);
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace moeserve::bench
