#include "loadgen/record.h"

#include <nlohmann/json.hpp>

namespace moeserve::loadgen {

double RequestRecord::tpot_s() const {
  if (!ok || completion_tokens < 2) return 0;
  return (e2e_s - ttft_s) / static_cast<double>(completion_tokens - 1);
}

nlohmann::json to_json(const RequestRecord& r) {
  nlohmann::json j = {{"id", r.id},
                      {"conversation", r.conversation},
                      {"turn", r.turn},
                      {"start_s", r.start_s},
                      {"ok", r.ok},
                      {"http_status", r.http_status},
                      {"e2e_ms", r.e2e_s * 1e3},
                      {"expected_input_tokens", r.expected_input_tokens},
                      {"expected_output_tokens", r.expected_output_tokens},
                      {"exact_output", r.exact_output},
                      {"prompt_tokens", r.prompt_tokens},
                      {"completion_tokens", r.completion_tokens},
                      {"cached_tokens", r.cached_tokens},
                      {"usage_reported", r.usage_reported},
                      {"chunks", r.chunks},
                      {"tool_calls", r.tool_calls},
                      {"images", r.images},
                      {"finish_reason", r.finish_reason}};
  if (r.ok) {
    j["ttft_ms"] = r.ttft_s * 1e3;
    j["tpot_ms"] = r.tpot_s() * 1e3;
    std::vector<double> itl_ms;
    itl_ms.reserve(r.itl_s.size());
    for (double s : r.itl_s) itl_ms.push_back(s * 1e3);
    j["itl_ms"] = std::move(itl_ms);
  } else {
    j["error"] = {{"cause", r.error_cause}, {"message", r.error_message}};
  }
  return j;
}

RequestRecord record_from_json(const nlohmann::json& j) {
  RequestRecord r;
  r.id = j.value("id", size_t{0});
  r.conversation = j.value("conversation", size_t{0});
  r.turn = j.value("turn", size_t{0});
  r.start_s = j.value("start_s", 0.0);
  r.ok = j.value("ok", false);
  r.http_status = j.value("http_status", 0);
  r.e2e_s = j.value("e2e_ms", 0.0) / 1e3;
  r.ttft_s = j.value("ttft_ms", 0.0) / 1e3;
  if (j.contains("itl_ms"))
    for (double ms : j["itl_ms"]) r.itl_s.push_back(ms / 1e3);
  r.chunks = j.value("chunks", size_t{0});
  r.expected_input_tokens = j.value("expected_input_tokens", size_t{0});
  r.expected_output_tokens = j.value("expected_output_tokens", size_t{0});
  r.exact_output = j.value("exact_output", false);
  r.prompt_tokens = j.value("prompt_tokens", size_t{0});
  r.completion_tokens = j.value("completion_tokens", size_t{0});
  r.cached_tokens = j.value("cached_tokens", size_t{0});
  r.usage_reported = j.value("usage_reported", false);
  r.tool_calls = j.value("tool_calls", size_t{0});
  r.images = j.value("images", size_t{0});
  r.finish_reason = j.value("finish_reason", std::string{});
  if (j.contains("error")) {
    r.error_cause = j["error"].value("cause", std::string{});
    r.error_message = j["error"].value("message", std::string{});
  }
  return r;
}

}  // namespace moeserve::loadgen
