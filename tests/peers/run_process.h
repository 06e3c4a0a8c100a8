#pragma once
// Runs a command to its end and hands back what it printed: the one way the suites run a tool (`moeserve
// tokenize`, node with an oracle or an SDK script, promtool, nginx -t). stdout and stderr come back apart;
// the timeout is a hang guard only (the whole process group is killed when it passes), never a verdict.

#include <chrono>
#include <string>
#include <vector>

namespace moeserve::peers {

struct RunOptions {
  // Each member has an initializer so that designated initializers may skip it (GCC 12 warns otherwise).
  std::vector<std::string> env{};  // "NAME=value" entries added to this process's environment
  std::string cwd{};               // where it runs ("" = here)
  std::string input{};             // written to its stdin, which is then closed (empty: stdin ends at once)
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // then SIGKILL to its process group
};

struct RunResult {
  int status = -1;         // the exit code, or 128 + the signal that ended it; -1 when it could not start
  bool timed_out = false;  // killed by the hang guard
  std::string out;         // stdout
  std::string err;         // stderr (or why it could not start)
};

// argv[0] is looked up in PATH when it has no '/'.
RunResult run_process(const std::vector<std::string>& argv, const RunOptions& options = {});

// A shell command line (`/bin/sh -c`), for callers that need its quoting, pipes or redirections.
RunResult run_shell(const std::string& command_line, const RunOptions& options = {});

struct CommandResult {
  int status = -1;     // as RunResult's
  std::string output;  // stdout and stderr together, in the order they were written
};

// A shell command line with stderr joined to stdout for the whole line (a list of commands included).
CommandResult run_command(const std::string& shell_command, const RunOptions& options = {});

}  // namespace moeserve::peers
