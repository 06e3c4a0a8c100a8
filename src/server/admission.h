#pragma once
// Admission control in front of the engine: at most max_running sequences generate at once (the reference
// deployment capped in-flight generations at 16 with a semaphore), then a bounded FIFO queue, then 429.
// Memory pressure above the threshold and draining refuse new work with 503. Queued requests that wait longer
// than the queue timeout are dropped by their owner (Ticket::leave) and answered with 503.
//
// Thread-safe. Admission callbacks run outside the lock, on the thread that freed the capacity.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "server/memory_monitor.h"

namespace moeserve::server {

struct AdmissionOptions {
  int max_running = 16;       // sequences generating at once (a request with n choices counts n); 0: no cap
  int max_queued = 256;       // requests waiting; beyond this: 429
  std::chrono::milliseconds queue_timeout{std::chrono::seconds(60)};
  double memory_pressure_threshold = 0.86;  // fraction of the memory limit; 0 disables
};

class Admission {
 public:
  class Ticket {
   public:
    enum class State { kQueued, kRunning, kLeft };
    State state() const;
    // Gives the capacity back (running) or leaves the queue (queued). Returns the state it was in.
    // Idempotent; the destructor calls it.
    State leave();
    // Leaves only if still queued (a queue timeout must not free capacity a racing admission just took).
    bool leave_if_queued();
    ~Ticket();

   private:
    friend class Admission;
    State leave_impl(bool only_if_queued);
    Ticket(Admission& owner, int weight, std::function<void()> on_admitted)
        : owner_(owner), weight_(weight), on_admitted_(std::move(on_admitted)) {}
    Admission& owner_;
    int weight_;
    State state_ = State::kLeft;  // until enter() decides
    std::function<void()> on_admitted_;
  };

  // Counters the metrics layer reads.
  struct Stats {
    int running = 0;  // sequences
    int queued = 0;   // requests
    uint64_t rejected_queue_full = 0;
    uint64_t rejected_memory = 0;
    uint64_t rejected_draining = 0;
    MemoryReading memory;
  };

  Admission(AdmissionOptions options, std::shared_ptr<MemoryMonitor> memory);

  // Admits now (on_admitted runs before enter returns) or queues (it runs later from another thread).
  // Throws ApiError 429 (queue full), 503 (memory pressure or draining), 400 (weight above max_running).
  std::shared_ptr<Ticket> enter(int weight, std::function<void()> on_admitted);

  // The sequence cap, once the engine has sized its running set (serve starts listening before that).
  void set_max_running(int max_running);
  void set_draining(bool draining);
  bool draining() const;
  const AdmissionOptions& options() const { return options_; }
  Stats stats();

 private:
  // Moves queued tickets to running while they fit; returns those admitted (callbacks run by the caller).
  std::vector<std::shared_ptr<Ticket>> admit_waiting_locked();

  AdmissionOptions options_;
  std::shared_ptr<MemoryMonitor> memory_;
  mutable std::mutex mutex_;
  int running_ = 0;
  bool draining_ = false;
  std::deque<std::weak_ptr<Ticket>> queue_;
  size_t queued_ = 0;
  uint64_t rejected_queue_full_ = 0, rejected_memory_ = 0, rejected_draining_ = 0;
};

}  // namespace moeserve::server
