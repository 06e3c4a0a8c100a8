#pragma once
// Runs the real `moeserve serve` binary (MOESERVE_BINARY) on a free loopback port for end-to-end tests:
// waits for its ready banner, collects its output, and stops it with a signal like an orchestrator would.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace moeserve::server {

class ServeProcess {
 public:
  // cwd: where it runs ("" = here); extra_env: "NAME=value" entries added to this process's environment.
  // command: another subcommand ("route") runs with `args` alone (no --host and --port of serve's).
  explicit ServeProcess(std::vector<std::string> args, const std::string& cwd = "",
                        std::vector<std::string> extra_env = {}, const std::string& command = "serve") {
    std::vector<std::string> argv_s = {MOESERVE_BINARY, command};
    if (command == "serve") argv_s.insert(argv_s.end(), {"--host", "127.0.0.1", "--port", "0"});
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
    std::vector<char*> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    for (auto& e : extra_env) env.push_back(e.data());
    env.push_back(nullptr);
    int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), env.data());
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) throw std::runtime_error("cannot start " + argv_s[0]);
    out_fd_ = fds[0];
    reader_ = std::thread([this] { read_output(); });
  }
  ~ServeProcess() {
    if (pid_ > 0 && !exit_status_) {
      kill(pid_, SIGKILL);
      wait_exit(std::chrono::seconds(10));
    }
    if (reader_.joinable()) reader_.join();
    if (out_fd_ >= 0) close(out_fd_);
  }

  // Waits for "moeserve ready: ... url=http://127.0.0.1:PORT"; false if it exited or timed out first.
  bool wait_ready(std::chrono::seconds timeout = std::chrono::seconds(300)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mutex_);
        size_t at = output_.find("moeserve ready:");
        if (at != std::string::npos) {
          size_t url = output_.find("url=http://127.0.0.1:", at);
          size_t eol = output_.find('\n', at);
          if (url != std::string::npos && eol != std::string::npos) {
            port_ = static_cast<uint16_t>(std::stoi(output_.substr(url + 21, eol - url - 21)));
            banner_ = output_.substr(at, eol - at);
            return true;
          }
        }
      }
      if (poll_exit()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Waits until the output contains `text`; false if it exited or timed out first.
  bool wait_for(const std::string& text, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (output().find(text) != std::string::npos) return true;
      if (poll_exit()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  uint16_t port() const { return port_; }
  const std::string& banner() const { return banner_; }
  std::string output() {
    std::lock_guard lock(mutex_);
    return output_;
  }
  void signal(int sig) { kill(pid_, sig); }
  // The exit code (or 128 + signal), once the process has ended within the timeout. Once it has, output()
  // holds everything it wrote: the reader is joined at the pipe's end (a process that exits at once could
  // otherwise be found with its message still in the pipe).
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!poll_exit() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (exit_status_ && reader_.joinable()) reader_.join();
    return exit_status_;
  }

 private:
  bool poll_exit() {
    if (exit_status_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  void read_output() {
    char buf[4096];
    for (;;) {
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) return;
      std::lock_guard lock(mutex_);
      output_.append(buf, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::thread reader_;
  std::mutex mutex_;
  std::string output_;
  uint16_t port_ = 0;
  std::string banner_;
  std::optional<int> exit_status_;
};

}  // namespace moeserve::server
