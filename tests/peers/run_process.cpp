#include "run_process.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

extern char** environ;

namespace moeserve::peers {

namespace {

// Appends what is readable on fd to `to`; false once the pipe has ended.
bool read_some(int fd, std::string& to) {
  char buf[16384];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  to.append(buf, size_t(n));
  return true;
}

int exit_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

RunResult run_process(const std::vector<std::string>& argv, const RunOptions& options) {
  RunResult result;
  if (argv.empty()) {
    result.err = "run_process: no command";
    return result;
  }
  std::vector<std::string> strings = argv;
  std::vector<char*> args;
  for (auto& a : strings) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> extra_env = options.env;
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  for (auto& e : extra_env) env.push_back(e.data());
  env.push_back(nullptr);

  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    result.err = std::string("run_process: pipe failed: ") + std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  // Its own process group, so that the hang guard also ends what a shell or node started.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(in[0]), ::close(out[1]), ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]), ::close(out[0]), ::close(err[0]);
    result.err = "cannot start " + argv[0] + ": " + std::strerror(rc);
    return result;
  }

  // stdin is written as the child reads it, while its output is read, so neither side can block the other.
  int in_fd = in[1];
  ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  ::signal(SIGPIPE, SIG_IGN);  // a child that exits without reading all its input must not end the test
  size_t written = 0;
  if (options.input.empty()) ::close(in_fd), in_fd = -1;
  int out_fd = out[0], err_fd = err[0];
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  while (out_fd >= 0 || err_fd >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}, {in_fd, POLLOUT, 0}};
    const int ready = ::poll(fds, 3, int(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (fds[0].revents && !read_some(out_fd, result.out)) ::close(out_fd), out_fd = -1;
    if (fds[1].revents && !read_some(err_fd, result.err)) ::close(err_fd), err_fd = -1;
    if (fds[2].revents) {
      const ssize_t n = ::write(in_fd, options.input.data() + written, options.input.size() - written);
      if (n > 0) written += size_t(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == options.input.size())
        ::close(in_fd), in_fd = -1;
    }
  }
  for (int fd : {in_fd, out_fd, err_fd})
    if (fd >= 0) ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = exit_status(status);
  return result;
}

RunResult run_shell(const std::string& command_line, const RunOptions& options) {
  return run_process({"/bin/sh", "-c", command_line}, options);
}

CommandResult run_command(const std::string& shell_command, const RunOptions& options) {
  RunResult r = run_shell("exec 2>&1; " + shell_command, options);
  return {r.status, r.out + r.err};  // err holds only a failure to start
}

}  // namespace moeserve::peers
