#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace moeserve {
namespace {

thread_local bool t_inside_pool = false;
std::atomic<size_t> g_requested_threads{0};

std::pair<size_t, size_t> part_range(size_t n, size_t parts, size_t part) {
  size_t base = n / parts, extra = n % parts;
  size_t begin = part * base + std::min(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_grain) {
  if (n == 0) return;
  size_t parts = std::min(size(), std::max<size_t>(1, n / std::max<size_t>(1, min_grain)));
  if (parts <= 1 || t_inside_pool || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::unique_lock lock(mutex_);
    // One job at a time: a second caller waits for the first to finish.
    done_.wait(lock, [&] { return job_ == nullptr; });
    job_ = &fn;
    job_n_ = n;
    job_parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
  }
  wake_.notify_all();
  t_inside_pool = true;
  auto [b, e] = part_range(n, parts, 0);
  fn(b, e);
  t_inside_pool = false;
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  done_.notify_all();
}

void ThreadPool::worker_loop(size_t index) {
  t_inside_pool = true;
  size_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= job_parts_) continue;
    const auto* fn = job_;
    auto [b, e] = part_range(job_n_, job_parts_, index);
    lock.unlock();
    (*fn)(b, e);
    lock.lock();
    if (--pending_ == 0) done_.notify_all();
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool(g_requested_threads.load());
  return pool;
}

void ThreadPool::set_global_threads(size_t threads) { g_requested_threads = threads; }

}  // namespace moeserve
