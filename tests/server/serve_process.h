#pragma once
// Runs the real `moeserve serve` binary (MOESERVE_BINARY) on a free loopback port for end-to-end tests: a
// peers::ChildProcess (output collected, killed when the test ends, signals like an orchestrator's) that
// knows serve's ready banner.

#include <chrono>
#include <string>
#include <vector>

#include "child_process.h"

namespace moeserve::server {

class ServeProcess : public peers::ChildProcess {
 public:
  // cwd: where it runs ("" = here); extra_env: "NAME=value" entries added to this process's environment;
  // command: the subcommand (another, e.g. "route", takes its own --host/--port among args).
  explicit ServeProcess(std::vector<std::string> args, const std::string& cwd = "",
                        std::vector<std::string> extra_env = {}, const std::string& command = "serve")
      : ChildProcess(command_argv(command, std::move(args)), {.cwd = cwd, .env = std::move(extra_env)}) {}

  // Waits for "moeserve ready: ... url=http://127.0.0.1:PORT"; false if it exited or timed out first. The
  // default timeout is a hang guard: loading is slow on a loaded 2-core machine.
  bool wait_ready(std::chrono::seconds timeout = std::chrono::seconds(300)) {
    auto line = wait_for_line("moeserve ready:", timeout);
    if (!line) return false;
    const std::string kUrl = "url=http://127.0.0.1:";
    size_t url = line->find(kUrl);
    if (url == std::string::npos) return false;
    port_ = static_cast<uint16_t>(std::stoi(line->substr(url + kUrl.size())));
    banner_ = line->substr(line->find("moeserve ready:"));
    return true;
  }
  // Waits until a line of the output holds `text`; false if it exited or timed out first (a hang guard).
  bool wait_for(const std::string& text, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    return wait_for_line(text, timeout).has_value();
  }
  uint16_t port() const { return port_; }
  const std::string& banner() const { return banner_; }

 private:
  static std::vector<std::string> command_argv(const std::string& command, std::vector<std::string> args) {
    std::vector<std::string> argv = {MOESERVE_BINARY, command};
    if (command == "serve") argv.insert(argv.end(), {"--host", "127.0.0.1", "--port", "0"});
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  uint16_t port_ = 0;
  std::string banner_;
};

}  // namespace moeserve::server
