#pragma once
// Summary statistics of one latency metric, computed the way vllm bench serve does (numpy semantics):
// percentiles interpolate linearly between closest ranks, std is the population standard deviation.

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <vector>

namespace moeserve::loadgen {

// Linear-interpolation percentile (numpy's default) of values sorted ascending; p in [0, 100].
// Returns 0 for an empty input.
double percentile_sorted(std::span<const double> sorted, double p);

struct Distribution {
  size_t count = 0;
  double mean = 0, std = 0, min = 0, median = 0, p90 = 0, p99 = 0, max = 0;

  static Distribution of(std::vector<double> values);
};

nlohmann::json to_json(const Distribution& d);
Distribution distribution_from_json(const nlohmann::json& j);

}  // namespace moeserve::loadgen
