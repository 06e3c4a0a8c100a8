#pragma once
// Subcommand registration. Each cmd_<name>.cpp defines one command and registers it at static-init time:
//
//   static moeserve::app::Registration reg{{"generate", "Run a prompt through a model", 20, setup}};
//
// where setup(CLI::App& sub) declares the flags and returns the function to run (exit code).

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::app {

struct Command {
  std::string name;
  std::string description;
  int order;  // position in --help: serving commands first, tools last
  std::function<std::function<int()>(CLI::App&)> setup;
  // For an unknown flag: what to use instead ("" when nothing), so a peer's command line fails with a way
  // out.
  std::function<std::string(const std::string& flag)> unknown_flag_hint = {};
  // Single-dash long flags (vLLM's -tp) and the spelling CLI11 parses, rewritten before parsing.
  std::vector<std::pair<std::string, std::string>> spellings = {};
};

std::vector<Command>& registry();

struct Registration {
  explicit Registration(Command command) { registry().push_back(std::move(command)); }
};

}  // namespace moeserve::app
