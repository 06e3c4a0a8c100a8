#include "server/background_runner.h"

#include <vector>

namespace moeserve::server {

BackgroundRunner::BackgroundRunner() : state_(std::make_shared<State>()), thread_([this] { loop(); }) {}

BackgroundRunner::~BackgroundRunner() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  thread_.join();
  // The thread is gone, so this is the bodies' only caller now.
  for (auto& [id, task] : state_->tasks)
    if (task.started) task.body->cancel();
  state_->tasks.clear();
}

uint64_t BackgroundRunner::run(std::shared_ptr<AsyncBody> body, OnDone on_done) {
  uint64_t id;
  {
    std::lock_guard lock(state_->mutex);
    id = state_->next_id++;
    Task& task = state_->tasks[id];
    task.body = std::move(body);
    task.on_done = std::move(on_done);
  }
  state_->cv.notify_all();
  return id;
}

void BackgroundRunner::cancel(uint64_t id) {
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->tasks.find(id);
    if (it == state_->tasks.end()) return;
    it->second.cancelled = true;
  }
  state_->cv.notify_all();
}

size_t BackgroundRunner::running() const {
  std::lock_guard lock(state_->mutex);
  return state_->tasks.size();
}

bool BackgroundRunner::step(const std::weak_ptr<State>& weak, uint64_t id, Task& task, bool cancel,
                            Clock::time_point now) {
  if (cancel) {
    if (task.started) task.body->cancel();
    return false;
  }
  if (!task.started) {
    task.started = true;
    task.body->start([weak, id] {
      auto state = weak.lock();
      if (!state) return;
      {
        std::lock_guard lock(state->mutex);
        auto it = state->tasks.find(id);
        if (it == state->tasks.end()) return;
        it->second.woken = true;
      }
      state->cv.notify_all();
    });
  }
  AsyncBody::Step s = task.body->poll(now);
  if (s.head) task.status = s.head->status;
  if (task.status >= 400) task.error_body += s.data;
  task.wake_at = s.wake_at;
  if (!s.done) return true;
  task.on_done(task.status, task.error_body);
  return false;
}

void BackgroundRunner::loop() {
  std::weak_ptr<State> weak = state_;
  std::unique_lock lock(state_->mutex);
  while (!state_->stopping) {
    const auto now = Clock::now();
    struct Due {
      uint64_t id;
      Task* task;
      bool cancel;  // read here, under the lock: cancel() sets it from other threads
    };
    std::vector<Due> due;
    std::optional<Clock::time_point> next;
    for (auto& [id, task] : state_->tasks) {
      if (task.woken || task.cancelled || (task.wake_at && *task.wake_at <= now)) {
        task.woken = false;
        due.push_back({id, &task, task.cancelled});
      } else if (task.wake_at && (!next || *task.wake_at < *next)) {
        next = task.wake_at;
      }
    }
    if (due.empty()) {
      if (next) {
        state_->cv.wait_until(lock, *next);
      } else {
        state_->cv.wait(lock);
      }
      continue;
    }
    // Only this thread erases tasks (and a rehash moves no element), so the pointers stay valid while the
    // lock is released; the fields step() touches are this thread's alone.
    std::vector<uint64_t> ended;
    lock.unlock();
    for (const Due& d : due)
      if (!step(weak, d.id, *d.task, d.cancel, now)) ended.push_back(d.id);
    lock.lock();
    for (uint64_t id : ended) state_->tasks.erase(id);
  }
}

}  // namespace moeserve::server
