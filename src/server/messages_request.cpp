#include "server/messages_request.h"

#include <fmt/format.h>

#include "common/bounded_json.h"
#include "server/api_error.h"
#include "server/body_fields.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// A string, or text blocks joined (system prompts, tool results).
std::string plain_text(const json& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw invalid_param(param, "must be a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("{}[{}]", param, i);
    if (!v[i].is_object() || v[i].value("type", "") != "text")
      throw invalid_param(p + ".type", "must be 'text'");
    text += required_string(v[i], "text", p + ".text");
  }
  return text;
}

// An image block's source as an image URL: base64 data (a data: URL of its media_type) or a url.
std::string image_url(const json& block, const std::string& param) {
  const json* source = present(block, "source");
  if (!source || !source->is_object()) throw invalid_param(param, "is required");
  const std::string type = required_string(*source, "type", param + ".type");
  if (type == "url") return required_string(*source, "url", param + ".url");
  if (type != "base64") throw invalid_param(param + ".type", "must be base64 or url, got {}", brief(type));
  return "data:" + required_string(*source, "media_type", param + ".media_type") + ";base64," +
         required_string(*source, "data", param + ".data");
}

// One Anthropic message -> chat messages (a user turn's tool results become tool messages first).
void append_message(const json& m, const std::string& p, json& out) {
  if (!m.is_object()) throw invalid_param(p, "must be an object");
  std::string role = required_string(m, "role", p + ".role");
  if (role != "user" && role != "assistant") throw invalid_param(p + ".role", "must be user or assistant");
  const json* content = present(m, "content");
  if (!content) throw invalid_param(p + ".content", "is required");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array())
    throw invalid_param(p + ".content", "must be a string or an array of content blocks");
  std::string text, thinking;
  json parts = json::array();  // with images: text and image_url parts in order
  json calls = json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const json& b = (*content)[i];
    std::string bp = fmt::format("{}.content[{}]", p, i);
    const json* type = b.is_object() ? present(b, "type") : nullptr;
    if (!type || !type->is_string()) throw invalid_param(bp, "must be an object with a string 'type'");
    const std::string t = type->get<std::string>();
    if (t == "text") {
      text += required_string(b, "text", bp + ".text");
    } else if (t == "image" && role == "user") {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::exchange(text, "")}});
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", image_url(b, bp + ".source")}}}});
    } else if (t == "tool_result" && role == "user") {
      const json* result = present(b, "content");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", required_string(b, "tool_use_id", bp + ".tool_use_id")},
                     {"content", result ? plain_text(*result, bp + ".content") : ""}});
    } else if (t == "tool_use" && role == "assistant") {
      const json* input = present(b, "input");
      if (!input || !input->is_object()) throw invalid_param(bp + ".input", "must be an object");
      calls.push_back(
          {{"id", required_string(b, "id", bp + ".id")},
           {"type", "function"},
           {"function", {{"name", required_string(b, "name", bp + ".name")}, {"arguments", *input}}}});
    } else if ((t == "thinking" || t == "redacted_thinking") && role == "assistant") {
      if (t == "thinking") thinking += required_string(b, "thinking", bp + ".thinking");
    } else {
      throw invalid_param(bp + ".type", "a {} message cannot carry a {} block here", role, brief(*type));
    }
  }
  if (role == "user" && text.empty() && parts.empty()) return;  // tool results only
  if (!parts.empty() && !text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  json msg = {{"role", role}, {"content", parts.empty() ? json(text) : parts}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
}

}  // namespace

ChatRequest parse_messages_request(std::string_view body, MessagesBody use) {
  json j = parse_json_object(body);
  json chat = json::object();
  json messages = json::array();
  if (const json* system = present(j, "system")) {
    messages.push_back({{"role", "system"}, {"content", plain_text(*system, "system")}});
  }
  const json* list = present(j, "messages");
  if (!list || !list->is_array() || list->empty())
    throw invalid_param("messages", "must be a non-empty array");
  for (size_t i = 0; i < list->size(); ++i)
    append_message((*list)[i], fmt::format("messages[{}]", i), messages);
  chat["messages"] = std::move(messages);
  if (const json* v = present(j, "model")) chat["model"] = *v;
  if (use == MessagesBody::kCreate) {
    // Anthropic requires max_tokens; a request without one is answered as the API would.
    if (!present(j, "max_tokens")) throw invalid_param("max_tokens", "is required");
    chat["max_tokens"] = j["max_tokens"];
    for (const char* key : {"temperature", "top_p", "top_k", "stream"}) {
      if (const json* v = present(j, key)) chat[key] = *v;
    }
    if (const json* v = present(j, "stop_sequences")) chat["stop"] = *v;
  }
  if (const json* v = present(j, "tools")) {
    if (!v->is_array()) throw invalid_param("tools", "must be an array");
    json tools = json::array();
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object()) throw invalid_param(p, "must be an object");
      if (const json* type = present(t, "type"); type && *type != "custom") {
        throw invalid_param(p + ".type", "only client tools (name, input_schema) are supported, got {}",
                            brief(*type));
      }
      json fn = {{"name", t.contains("name") ? t["name"] : json(nullptr)}};
      if (const json* d = present(t, "description")) fn["description"] = *d;
      if (const json* s = present(t, "input_schema")) fn["parameters"] = *s;
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(tools);
  }
  if (const json* v = present(j, "tool_choice")) {
    if (!v->is_object() || !v->contains("type"))
      throw invalid_param("tool_choice", "must be an object with a type");
    const json& type = (*v)["type"];
    if (type == "auto" || type == "none") {
      chat["tool_choice"] = type;
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "tool") {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", v->value("name", "")}}}};
    } else {
      throw invalid_param("tool_choice", "type must be auto, any, tool or none, got {}", brief(type));
    }
    if (v->value("disable_parallel_tool_use", false)) chat["parallel_tool_calls"] = false;
  }
  if (const json* v = present(j, "thinking")) {
    const json* type = v->is_object() ? present(*v, "type") : nullptr;
    if (!type || (*type != "enabled" && *type != "disabled")) {
      throw invalid_param("thinking", "must be {{\"type\": \"enabled\"}} or {{\"type\": \"disabled\"}}");
    }
    chat["chat_template_kwargs"] = {{"enable_thinking", *type == "enabled"}};
  }
  return parse_chat_request(chat.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace moeserve::server
