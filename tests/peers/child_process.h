#pragma once
// A child process for the end-to-end suites (`moeserve serve`, `moeserve route`, nginx, a deploy script): its
// stdout and stderr captured (and copied to a log file when asked), a wait for a line of its output or for
// its exit, and a clean stop when the test ends. Waits are hang guards only: none decides a test by its time.

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::peers {

struct ChildOptions {
  // Each member has an initializer so that designated initializers may skip it (GCC 12 warns otherwise).
  std::string cwd{};               // where it runs ("" = here)
  std::vector<std::string> env{};  // "NAME=value" entries added to this process's environment
  std::string log_path{};          // "" = none; else its output is copied there as it arrives
  int stop_signal = SIGKILL;       // what the destructor sends (SIGTERM for a process that must clean up)
  std::chrono::milliseconds stop_grace{std::chrono::seconds(30)};  // then SIGKILL
};

class ChildProcess {
 public:
  // argv[0] is looked up in PATH when it has no '/'. Throws std::runtime_error when it cannot be started.
  explicit ChildProcess(std::vector<std::string> argv, ChildOptions options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig);
  bool running();
  // The exit code (or 128 + signal), once it has exited within the timeout; nullopt if it is still running.
  // Once it has exited, output() holds everything it wrote.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  // stop_signal, up to stop_grace for the exit, then SIGKILL; returns the exit status.
  int stop();

  std::string output();
  // The first whole line of its output that contains `text` (without the newline), once it has arrived;
  // nullopt when it exits or the timeout passes first.
  std::optional<std::string> wait_for_line(const std::string& text, std::chrono::milliseconds timeout);

 private:
  bool reap(bool block);
  void read_output();
  void finish_reading();
  std::optional<std::string> find_line(const std::string& text);

  ChildOptions options_;
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  int out_fd_ = -1;
  int log_fd_ = -1;
  std::thread reader_;
  std::mutex mutex_;
  std::string output_;
  bool stop_reading_ = false;  // under mutex_
};

}  // namespace moeserve::peers
