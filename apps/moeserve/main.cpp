// moeserve: one binary, one subcommand per job (serve, route, bench, plan, doctor, generate, verify, ...).
#include <algorithm>
#include <cstdio>

#include "command.h"
#include "common/error.h"
#include "common/log.h"
#include "common/thread_pool.h"

namespace moeserve::app {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace moeserve::app

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App cli{"moeserve: a serving stack for Qwen3.5 mixture-of-experts models"};
  cli.require_subcommand(1);
  cli.set_version_flag("--version", "moeserve 0.1.0");
  std::string log_level = "info";
  size_t threads = 0;
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")->capture_default_str();
  cli.add_option("--threads", threads, "CPU worker threads (0 = one per core)");

  auto& commands = app::registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.order < b.order; });
  std::function<int()> run;
  for (auto& command : commands) {
    CLI::App* sub = cli.add_subcommand(command.name, command.description);
    auto action = command.setup(*sub);
    sub->callback([&run, action] { run = action; });
  }
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  try {
    set_log_level(log_level);
    ThreadPool::set_global_threads(threads);
    return run ? run() : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
