#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace moeserve::loadgen {

double percentile_sorted(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution Distribution::of(std::vector<double> values) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(sq / static_cast<double>(values.size()));
  d.min = values.front();
  d.max = values.back();
  d.median = percentile_sorted(values, 50);
  d.p90 = percentile_sorted(values, 90);
  d.p99 = percentile_sorted(values, 99);
  return d;
}

nlohmann::json to_json(const Distribution& d) {
  return {{"count", d.count},   {"mean", d.mean}, {"std", d.std}, {"min", d.min},
          {"median", d.median}, {"p90", d.p90},   {"p99", d.p99}, {"max", d.max}};
}

Distribution distribution_from_json(const nlohmann::json& j) {
  Distribution d;
  d.count = j.value("count", size_t{0});
  d.mean = j.value("mean", 0.0);
  d.std = j.value("std", 0.0);
  d.min = j.value("min", 0.0);
  d.median = j.value("median", 0.0);
  d.p90 = j.value("p90", 0.0);
  d.p99 = j.value("p99", 0.0);
  d.max = j.value("max", 0.0);
  return d;
}

}  // namespace moeserve::loadgen
