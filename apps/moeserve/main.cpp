// moeserve: one binary, one subcommand per job (serve, route, bench, plan, doctor, generate, verify, ...).
#include <algorithm>
#include <cstdio>
#include <string_view>

#include "command.h"
#include "common/error.h"
#include "common/log.h"
#include "common/thread_pool.h"

namespace moeserve::app {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The error for words no option took: the first unknown flag, with the command's hint for it or the nearest
// flag the command has (a typo of a peer's name is still a typo).
std::string unknown_argument_error(const std::vector<std::string>& words, const CLI::App& cli,
                                   const Command* command) {
  auto flag =
      std::find_if(words.begin(), words.end(), [](const std::string& w) { return w.starts_with("-"); });
  if (flag == words.end()) return fmt::format("unexpected argument '{}'", words.front());
  std::string name = flag->substr(0, flag->find('='));
  const CLI::App* app = &cli;
  if (command) app = cli.get_subcommand(command->name);
  std::string where = command ? command->name + ": " : "";
  std::string hint = command && command->unknown_flag_hint ? command->unknown_flag_hint(name) : "";
  if (!hint.empty()) return fmt::format("{}unknown flag {}; moeserve's equivalent: {}", where, name, hint);
  std::string nearest;
  size_t best = 4;  // up to three edits: a typo, not another flag
  for (const CLI::Option* opt : app->get_options()) {
    for (const std::string& long_name : opt->get_lnames()) {
      size_t d = edit_distance(name, "--" + long_name);
      if (d < best) best = d, nearest = "--" + long_name;
    }
  }
  return nearest.empty() ? fmt::format("{}unknown flag {} (see moeserve {}--help)", where, name,
                                       command ? command->name + " " : "")
                         : fmt::format("{}unknown flag {}; did you mean {}?", where, name, nearest);
}

}  // namespace
}  // namespace moeserve::app

int main(int argc, char** argv) {
  using namespace moeserve;
  CLI::App cli{"moeserve: a serving stack for Qwen3.5 mixture-of-experts models"};
  cli.require_subcommand(1);
  cli.set_version_flag("--version", "moeserve 0.1.0");
  // Options of moeserve itself (--log-level) work after the subcommand too, as SGLang's and vLLM's do; words
  // nobody takes come back here, so the error can say what to use instead.
  cli.fallthrough();
  cli.allow_extras();
  std::string log_level = "info";
  size_t threads = 0;
  cli.add_option("--log-level", log_level, "trace|debug|info|warn|warning|error|critical|off")
      ->capture_default_str();
  cli.add_option("--threads", threads, "CPU worker threads (0 = one per core)");

  auto& commands = app::registry();
  std::sort(commands.begin(), commands.end(), [](auto& a, auto& b) { return a.order < b.order; });
  std::function<int()> run;
  const app::Command* chosen = nullptr;
  for (auto& command : commands) {
    CLI::App* sub = cli.add_subcommand(command.name, command.description);
    auto action = command.setup(*sub);
    sub->callback([&run, &chosen, &command, action] {
      run = action;
      chosen = &command;
    });
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    auto command = std::find_if(commands.begin(), commands.end(), [&](auto& c) { return c.name == args[i]; });
    if (command == commands.end()) continue;
    for (size_t j = i + 1; j < args.size(); ++j)
      for (const auto& [from, to] : command->spellings)
        if (args[j] == from) args[j] = to;
    break;
  }
  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes the words last first
    cli.parse(args);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  try {
    if (!cli.remaining().empty()) fail("{}", app::unknown_argument_error(cli.remaining(), cli, chosen));
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
