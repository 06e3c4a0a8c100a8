#include "child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace moeserve::peers {

ChildProcess::ChildProcess(std::vector<std::string> argv, ChildOptions options)
    : options_(std::move(options)) {
  if (argv.empty()) throw std::runtime_error("ChildProcess: no command");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  for (auto& e : options_.env) env.push_back(e.data());
  env.push_back(nullptr);
  if (!options_.log_path.empty()) {
    log_fd_ = ::open(options_.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("ChildProcess: pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  if (!options_.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options_.cwd.c_str());
  int rc = ::posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (log_fd_ >= 0) ::close(log_fd_);
    pid_ = -1;
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  out_fd_ = fds[0];
  reader_ = std::thread([this] { read_output(); });
}

ChildProcess::~ChildProcess() {
  if (running()) stop();
  finish_reading();
  if (out_fd_ >= 0) ::close(out_fd_);
  if (log_fd_ >= 0) ::close(log_fd_);
}

void ChildProcess::signal(int sig) {
  if (pid_ > 0 && !exit_status_) ::kill(pid_, sig);
}

bool ChildProcess::reap(bool block) {
  if (exit_status_) return true;
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) return false;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

bool ChildProcess::running() {
  return pid_ > 0 && !reap(false);
}

std::optional<int> ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reap(false) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (exit_status_) finish_reading();
  return exit_status_;
}

int ChildProcess::stop() {
  if (!running()) return exit_status_.value_or(-1);
  signal(options_.stop_signal);
  if (!wait_exit(options_.stop_grace)) {
    ::kill(pid_, SIGKILL);
    reap(true);
    finish_reading();
  }
  return *exit_status_;
}

std::string ChildProcess::output() {
  std::lock_guard lock(mutex_);
  return output_;
}

std::optional<std::string> ChildProcess::find_line(const std::string& text) {
  std::lock_guard lock(mutex_);
  size_t at = output_.find(text);
  if (at == std::string::npos) return std::nullopt;
  size_t end = output_.find('\n', at);
  if (end == std::string::npos) return std::nullopt;
  size_t begin = output_.rfind('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  return output_.substr(begin, end - begin);
}

std::optional<std::string> ChildProcess::wait_for_line(const std::string& text,
                                                       std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto line = find_line(text)) return line;
    if (!running()) {
      finish_reading();  // what it wrote before exiting may still have been in the pipe
      return find_line(text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

// Reads until the pipe ends, or until told to stop: then it drains what is already in the pipe and returns,
// so that a grandchild still holding the pipe open (a script's server, nginx's workers) cannot hold it.
void ChildProcess::read_output() {
  char buf[4096];
  for (;;) {
    bool stopping;
    {
      std::lock_guard lock(mutex_);
      stopping = stop_reading_;
    }
    pollfd p{out_fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, stopping ? 0 : 50);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      if (stopping) return;
      continue;
    }
    ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    if (log_fd_ >= 0) {
      for (ssize_t off = 0; off < n;) {
        ssize_t w = ::write(log_fd_, buf + off, size_t(n - off));
        if (w <= 0) break;
        off += w;
      }
    }
    std::lock_guard lock(mutex_);
    output_.append(buf, size_t(n));
  }
}

void ChildProcess::finish_reading() {
  {
    std::lock_guard lock(mutex_);
    stop_reading_ = true;
  }
  if (reader_.joinable()) reader_.join();
}

}  // namespace moeserve::peers
