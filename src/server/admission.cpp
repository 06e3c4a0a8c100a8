#include "server/admission.h"

#include <fmt/format.h>

#include "server/api_error.h"

namespace moeserve::server {

Admission::Admission(AdmissionOptions options, std::shared_ptr<MemoryMonitor> memory)
    : options_(options), memory_(std::move(memory)) {}

std::shared_ptr<Admission::Ticket> Admission::enter(int weight, std::function<void()> on_admitted) {
  // Sample memory before taking our lock: the monitor may read files.
  std::optional<MemoryReading> mem;
  if (memory_ && options_.memory_pressure_threshold > 0) mem = memory_->reading();

  std::shared_ptr<Ticket> ticket(new Ticket(*this, weight, std::move(on_admitted)));
  {
    std::lock_guard lock(mutex_);
    if (draining_) {
      ++rejected_draining_;
      ApiError e(503, "the server is shutting down and accepts no new requests", "service_unavailable");
      throw e;
    }
    if (mem && mem->limit_bytes && mem->fraction() > options_.memory_pressure_threshold) {
      ++rejected_memory_;
      ApiError e(503,
                 fmt::format("memory pressure: {:.1f} of {:.1f} GiB used ({:.0f}% > threshold {:.0f}%, {}); "
                             "retry later",
                             mem->used_bytes / 1073741824.0, mem->limit_bytes / 1073741824.0,
                             100 * mem->fraction(), 100 * options_.memory_pressure_threshold, mem->source),
                 "service_unavailable");
      e.retry_after_s = 1;
      throw e;
    }
    if (options_.max_running > 0 && weight > options_.max_running) {
      throw invalid_param("n", "asks for {} sequences but the server runs at most {} at once", weight,
                          options_.max_running);
    }
    bool fits = options_.max_running == 0 || running_ + weight <= options_.max_running;
    if (queued_ == 0 && fits) {
      running_ += weight;
      ticket->state_ = Ticket::State::kRunning;
    } else {
      if (queued_ >= static_cast<size_t>(options_.max_queued)) {
        ++rejected_queue_full_;
        ApiError e(429,
                   fmt::format("the server is at capacity ({} sequences running, {} requests queued); retry later",
                               running_, queued_),
                   "rate_limit_error");
        e.retry_after_s = 1;
        throw e;
      }
      ticket->state_ = Ticket::State::kQueued;
      queue_.push_back(ticket);
      ++queued_;
    }
  }
  if (ticket->state_ == Ticket::State::kRunning) ticket->on_admitted_();
  return ticket;
}

std::vector<std::shared_ptr<Admission::Ticket>> Admission::admit_waiting_locked() {
  std::vector<std::shared_ptr<Ticket>> admitted;
  while (!queue_.empty()) {
    auto t = queue_.front().lock();
    if (!t || t->state_ != Ticket::State::kQueued) {
      queue_.pop_front();
      continue;
    }
    if (options_.max_running > 0 && running_ + t->weight_ > options_.max_running) break;  // strict FIFO
    queue_.pop_front();
    --queued_;
    running_ += t->weight_;
    t->state_ = Ticket::State::kRunning;
    admitted.push_back(std::move(t));
  }
  return admitted;
}

void Admission::set_max_running(int max_running) {
  std::vector<std::shared_ptr<Ticket>> admitted;
  {
    std::lock_guard lock(mutex_);
    options_.max_running = max_running;
    admitted = admit_waiting_locked();
  }
  for (auto& t : admitted) t->on_admitted_();
}

Admission::Ticket::State Admission::Ticket::state() const {
  std::lock_guard lock(owner_.mutex_);
  return state_;
}

Admission::Ticket::State Admission::Ticket::leave() { return leave_impl(false); }

bool Admission::Ticket::leave_if_queued() { return leave_impl(true) == State::kQueued; }

Admission::Ticket::State Admission::Ticket::leave_impl(bool only_if_queued) {
  std::vector<std::shared_ptr<Ticket>> admitted;
  State was;
  {
    std::lock_guard lock(owner_.mutex_);
    was = state_;
    if (was == State::kLeft || (only_if_queued && was != State::kQueued)) return was;
    state_ = State::kLeft;
    if (was == State::kQueued) {
      --owner_.queued_;
    } else {
      owner_.running_ -= weight_;
    }
    admitted = owner_.admit_waiting_locked();
  }
  for (auto& t : admitted) t->on_admitted_();
  return was;
}

Admission::Ticket::~Ticket() { leave(); }

void Admission::set_draining(bool draining) {
  std::lock_guard lock(mutex_);
  draining_ = draining;
}

bool Admission::draining() const {
  std::lock_guard lock(mutex_);
  return draining_;
}

Admission::Stats Admission::stats() {
  Stats s;
  if (memory_) s.memory = memory_->reading();
  std::lock_guard lock(mutex_);
  s.running = running_;
  s.queued = static_cast<int>(queued_);
  s.rejected_queue_full = rejected_queue_full_;
  s.rejected_memory = rejected_memory_;
  s.rejected_draining = rejected_draining_;
  return s;
}

}  // namespace moeserve::server
