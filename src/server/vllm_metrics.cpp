#include "server/vllm_metrics.h"

#include <map>
#include <vector>

namespace moeserve::server {

namespace {

// moeserve family -> the vLLM names it is also exported as.
const std::map<std::string, std::vector<std::string>, std::less<>>& vllm_names() {
  static const std::map<std::string, std::vector<std::string>, std::less<>> names = {
      {"moeserve:num_requests_running", {"vllm:num_requests_running"}},
      {"moeserve:num_requests_waiting", {"vllm:num_requests_waiting"}},
      {"moeserve:kv_cache_usage_perc", {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}},
      {"moeserve:prompt_tokens_total", {"vllm:prompt_tokens_total"}},
      {"moeserve:generation_tokens_total", {"vllm:generation_tokens_total"}},
      {"moeserve:time_to_first_token_seconds", {"vllm:time_to_first_token_seconds"}},
      {"moeserve:inter_token_latency_seconds",
       {"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"}},
      {"moeserve:e2e_request_latency_seconds", {"vllm:e2e_request_latency_seconds"}},
      {"moeserve:request_queue_time_seconds", {"vllm:request_queue_time_seconds"}},
      {"moeserve:request_prompt_tokens", {"vllm:request_prompt_tokens"}},
      {"moeserve:request_generation_tokens", {"vllm:request_generation_tokens"}},
      {"moeserve:request_success_total", {"vllm:request_success_total"}},
      {"moeserve:num_preemptions_total", {"vllm:num_preemptions_total"}},
      {"moeserve:prefix_cache_queries_total", {"vllm:prefix_cache_queries_total"}},
      {"moeserve:prefix_cache_hits_total", {"vllm:prefix_cache_hits_total"}},
  };
  return names;
}

// The family a line belongs to: the name after "# HELP " / "# TYPE ", or a sample's metric name.
std::string_view line_name(std::string_view line) {
  if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) line.remove_prefix(7);
  return line.substr(0, line.find_first_of(" {"));
}

}  // namespace

std::string vllm_metric_families(std::string_view exposition) {
  // Lines grouped by the family they belong to, in page order; histogram samples (name_bucket, _sum,
  // _count) go with the family whose HELP line came last.
  std::string out;
  std::string_view family;
  std::vector<std::string_view> lines;
  auto flush = [&] {
    auto it = vllm_names().find(family);
    if (it == vllm_names().end()) return;
    for (const auto& name : it->second) {
      for (std::string_view l : lines) {
        size_t at = l.find(family);
        out.append(l.substr(0, at)).append(name).append(l.substr(at + family.size())).push_back('\n');
      }
    }
  };
  for (size_t at = 0; at < exposition.size();) {
    size_t end = std::min(exposition.find('\n', at), exposition.size());
    std::string_view line = exposition.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    if (line.starts_with("# HELP ")) {
      flush();
      family = line_name(line);
      lines.clear();
    }
    if (!family.empty() && line_name(line).starts_with(family)) lines.push_back(line);
  }
  flush();
  return out;
}

}  // namespace moeserve::server
