#pragma once
// The main() of a benchmark that prints a table rather than running Google Benchmark (speculative_bench,
// step_budget_bench, cuda_model_bench, vision_tower_bench): the command line its CLI::App declares, then the
// run; --help and a bad flag answer as CLI11 does, and a failure of the run is one line on stderr and exit 1.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <functional>

namespace moeserve::bench {

inline int run_table_bench(CLI::App& app, int argc, char** argv, const std::function<int()>& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace moeserve::bench
