#pragma once
// A fixed pool of worker threads for data-parallel loops (GEMMs, per-head attention, batch encoding).
// parallel_for splits [0, n) into contiguous ranges, runs them on the workers and the calling thread,
// and returns when all are done. Calls from inside a worker run serially (no nested parallelism).

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // threads = 0 means one per hardware core.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // fn(begin, end) is called on disjoint ranges covering [0, n); ranges hold at least min_grain items.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_grain = 1);

  // The process-wide pool. set_global_threads must be called before the first use to take effect.
  static ThreadPool& global();
  static void set_global_threads(size_t threads);

 private:
  void worker_loop(size_t index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_parts_ = 0;
  size_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
};

}  // namespace moeserve
