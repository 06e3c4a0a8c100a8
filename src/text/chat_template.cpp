#include "text/chat_template.h"

#include "common/bounded_json.h"

namespace moeserve::text {

using ordered_json = nlohmann::ordered_json;

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : template_(source), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

std::string ChatTemplate::render(const ordered_json& messages, const ordered_json& tools,
                                 bool add_generation_prompt, const ordered_json& kwargs) const {
  ordered_json vars = ordered_json::object();
  vars["messages"] = messages;
  vars["tools"] = tools;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_token_;
  vars["eos_token"] = eos_token_;
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) vars[it.key()] = it.value();
  return template_.render(vars);
}

ordered_json ChatTemplate::normalize_openai_messages(const ordered_json& messages) {
  ordered_json out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      auto parsed = parse_bounded_json_or_discarded<ordered_json>(fn["arguments"].get<std::string>());
      if (!parsed.is_discarded() && parsed.is_object()) fn["arguments"] = std::move(parsed);
    }
  }
  return out;
}

}  // namespace moeserve::text
