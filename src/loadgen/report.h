#pragma once
// Turns the records of a run into the numbers people compare: the summary block (vllm bench serve's metrics
// plus failures by cause, per-turn TTFT and the prefix-cache ratio), the results document written by
// --output, and the table of `moeserve bench compare`.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loadgen/record.h"

namespace moeserve::loadgen {

// Summary of one run. duration_s is the wall time the throughputs divide by.
nlohmann::json summarize(const std::vector<RequestRecord>& records, double duration_s);

// The human-readable block printed after each run (`run` is one element of the document's "runs").
std::string format_run(const nlohmann::json& run);

struct CompareInput {
  std::string label;  // the endpoint column
  nlohmann::json document;
};

// Which throughput the difference column compares: "output", "total" or "requests".
std::string compare_table(const std::vector<CompareInput>& inputs, const std::string& metric = "output");

}  // namespace moeserve::loadgen
