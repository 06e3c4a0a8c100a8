#pragma once
// Subcommand registration. Each cmd_<name>.cpp defines one command and registers it at static-init time:
//
//   static moeserve::app::Registration reg{{"generate", "Run a prompt through a model", 20, setup}};
//
// where setup(CLI::App& sub) declares the flags and returns the function to run (exit code).

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace moeserve::app {

struct Command {
  std::string name;
  std::string description;
  int order;  // position in --help: serving commands first, tools last
  std::function<std::function<int()>(CLI::App&)> setup;
};

std::vector<Command>& registry();

struct Registration {
  explicit Registration(Command command) { registry().push_back(std::move(command)); }
};

}  // namespace moeserve::app
