#pragma once
// vLLM's metric names over moeserve's series, for dashboards and autoscalers written for vLLM: every
// moeserve: family with a vLLM counterpart is repeated under the vllm: name (and the older vLLM alias where
// dashboards still use one: gpu_cache_usage_perc, time_per_output_token_seconds). serve --vllm-metrics
// appends them to /metrics.

#include <string>
#include <string_view>

namespace moeserve::server {

// The vllm: families for a rendered moeserve exposition (text format 0.0.4): the HELP/TYPE lines and samples
// of each matching family, renamed. Families without a vLLM counterpart are left out.
std::string vllm_metric_families(std::string_view exposition);

}  // namespace moeserve::server
