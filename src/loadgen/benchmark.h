#pragma once
// A whole `moeserve bench` invocation: asks the server who it is (/version, /v1/models), runs each scenario
// at each load point, and builds the results document (configuration, server, per-request records, summaries)
// that --output writes, --plot draws and `bench compare` reads.

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/client.h"
#include "loadgen/prompt.h"
#include "loadgen/scenario.h"

namespace moeserve::loadgen {

struct BenchConfig {
  std::string url;
  std::string label;  // names this endpoint in plots and compare tables
  std::vector<Scenario> scenarios;
  std::vector<size_t> concurrencies;  // one run per value (a sweep when several)
  LoadOptions load;                   // concurrency is taken from `concurrencies`
  WorkloadOptions workload;           // scenario is taken from `scenarios`; an empty model asks /v1/models
  std::string tokenizer;              // recorded in the document
  bool progress = false;              // draw the progress line on stderr
};

// Requests a run sends when --num-requests is not given: enough for every concurrent slot to play a few
// dialogues, and at least 100.
size_t default_num_requests(const WorkloadOptions& workload, size_t concurrency);

// Runs everything; after each run, on_run(document so far, the new run) may print or save.
nlohmann::json run_benchmark(
    BenchConfig config, const PromptGenerator& prompts,
    const std::function<void(const nlohmann::json&, const nlohmann::json&)>& on_run = {});

}  // namespace moeserve::loadgen
