#pragma once
// Runs response bodies that no connection reads: the Responses API's background responses. One thread polls
// each body when it wakes (or its deadline passes), as a connection's strand would, until it is done, and
// reports how it ended; its output goes wherever the body itself publishes it (server/response_store.h).

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "server/http.h"

namespace moeserve::server {

class BackgroundRunner {
 public:
  // How a body ended: the status of its head (200 when it ran) and, for an error, its body.
  using OnDone = std::function<void(int status, const std::string& body)>;

  BackgroundRunner();
  // Cancels the bodies still running and joins the thread.
  ~BackgroundRunner();
  BackgroundRunner(const BackgroundRunner&) = delete;
  BackgroundRunner& operator=(const BackgroundRunner&) = delete;

  // Starts `body` (on the runner's thread); returns its id for cancel().
  uint64_t run(std::shared_ptr<AsyncBody> body, OnDone on_done);
  // Cancels the body (AsyncBody::cancel, on the runner's thread) unless it has ended; on_done is not called.
  void cancel(uint64_t id);
  size_t running() const;

 private:
  struct Task {
    std::shared_ptr<AsyncBody> body;
    OnDone on_done;
    bool started = false, woken = true, cancelled = false;
    std::optional<Clock::time_point> wake_at;
    int status = 200;
    std::string error_body;
  };
  // What wake-ups reach: shared, so that a body waking after the runner is gone finds nothing.
  struct State {
    mutable std::mutex mutex;
    std::condition_variable cv;
    bool stopping = false;
    uint64_t next_id = 0;
    std::unordered_map<uint64_t, Task> tasks;
  };
  void loop();
  // Polls (or cancels) one task outside the lock; false when it has ended.
  static bool step(const std::weak_ptr<State>& weak, uint64_t id, Task& task, bool cancel,
                   Clock::time_point now);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace moeserve::server
