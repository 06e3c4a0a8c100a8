#include "server/responses_request.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/api_error.h"
#include "server/body_fields.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// An input message's content: a string, or parts whose text is joined (input_text, output_text), or with
// input_image parts the chat content parts (text and image_url) in order.
json content_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw invalid_param(param, "must be a string or an array of content parts");
  std::string text;
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string p = fmt::format("{}[{}]", param, i);
    const json* type = part.is_object() ? present(part, "type") : nullptr;
    if (!type || !type->is_string()) throw invalid_param(p, "must be an object with a string 'type'");
    const std::string t = type->get<std::string>();
    if (t == "input_image") {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::exchange(text, "")}});
      parts.push_back({{"type", "image_url"},
                       {"image_url", {{"url", required_string(part, "image_url", p + ".image_url")}}}});
      continue;
    }
    if (t != "input_text" && t != "output_text" && t != "text") {
      throw invalid_param(
          p + ".type", "content part '{}' is not supported: this server takes text and images", brief(*type));
    }
    text += required_string(part, "text", p + ".text");
  }
  if (parts.empty()) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// Input items -> chat messages, appended to `messages`.
void append_input(const json& input, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) throw invalid_param("input", "must be a string or an array of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    std::string p = fmt::format("input[{}]", i);
    if (!item.is_object()) throw invalid_param(p, "must be an object");
    const json* type = present(item, "type");
    std::string t = type && type->is_string() ? type->get<std::string>() : "message";
    if (t == "message") {
      std::string role = required_string(item, "role", p + ".role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        throw invalid_param(p + ".role", "must be user, system, developer or assistant; got {}", brief(role));
      }
      const json* content = present(item, "content");
      if (!content) throw invalid_param(p + ".content", "is required");
      messages.push_back({{"role", role}, {"content", content_text(*content, p + ".content")}});
    } else if (t == "function_call") {
      json call = {{"id", required_string(item, "call_id", p + ".call_id")},
                   {"type", "function"},
                   {"function",
                    {{"name", required_string(item, "name", p + ".name")},
                     {"arguments", required_string(item, "arguments", p + ".arguments")}}}};
      // Calls of one turn follow each other: they join the assistant message before them.
      if (messages.empty() || messages.back()["role"] != "assistant") {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}});
      }
      json& last = messages.back();
      if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
      last["tool_calls"].push_back(std::move(call));
    } else if (t == "function_call_output") {
      const json* output = present(item, "output");
      if (!output) throw invalid_param(p + ".output", "is required");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", required_string(item, "call_id", p + ".call_id")},
                          {"content", content_text(*output, p + ".output")}});
    } else if (t == "reasoning") {
      // Past reasoning: Qwen3.5's template drops it from earlier turns, so it changes nothing.
    } else {
      throw invalid_param(p + ".type", "input item type {} is not supported", brief(*type));
    }
  }
}

// This request's input as the items the store lists (input_items): a string is one user message, a message's
// string content one text part, and a client's item id is kept when it is a string (else the store names
// the item). Runs after append_input has validated the input.
json input_items_of(const json& input) {
  json items = json::array();
  if (input.is_string()) {
    items.push_back(
        {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", input}}}}});
    return items;
  }
  for (const json& given : input) {
    json item = given;
    if (!present(item, "type")) item["type"] = "message";
    if (auto id = item.find("id");
        id != item.end() && (!id->is_string() || id->get_ref<const std::string&>().empty()))
      item.erase(id);
    if (item["type"] == "message" && item["content"].is_string()) {
      const char* part = item["role"] == "assistant" ? "output_text" : "input_text";
      item["content"] = json::array({{{"type", part}, {"text", item["content"]}}});
    }
    items.push_back(std::move(item));
  }
  return items;
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) throw invalid_param("tools", "must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    std::string p = fmt::format("tools[{}]", i);
    const json* type = t.is_object() ? present(t, "type") : nullptr;
    if (!type || *type != "function") {
      throw invalid_param(p + ".type", "only function tools are supported, got {}",
                          type ? brief(*type) : "none");
    }
    json fn = {{"name", t.contains("name") ? t["name"] : json(nullptr)}};
    if (const json* d = present(t, "description")) fn["description"] = *d;
    if (const json* params = present(t, "parameters")) fn["parameters"] = *params;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

ResponsesRequest parse_responses_request(std::string_view body, const ResponseStore& store) {
  json j = parse_json_object(body);
  ResponsesRequest r;
  json conversation = json::array();
  json input_items = json::array();
  if (const json* prev = present(j, "previous_response_id")) {
    if (!prev->is_string()) throw invalid_param("previous_response_id", "must be a string");
    auto stored = store.get(prev->get<std::string>());
    if (auto background = stored ? nullptr : store.background(prev->get<std::string>())) {
      throw invalid_param("previous_response_id",
                          "the background response {} has no answer to continue from (it is {})",
                          brief(*prev), background->status());
    }
    if (!stored) {
      throw ApiError(
          404,
          fmt::format("no response {} in this server's memory (it keeps the latest responses only, "
                      "and none across restarts)",
                      brief(*prev)),
          "invalid_request_error", "previous_response_id");
    }
    conversation = stored->messages;
    input_items = stored->input_items;
    for (const json& item : stored->response.value("output", json::array())) input_items.push_back(item);
    r.previous_response_id = prev->get<std::string>();
  }
  const json* input = present(j, "input");
  if (!input) throw invalid_param("input", "is required");
  append_input(*input, conversation);
  for (json& item : input_items_of(*input)) input_items.push_back(std::move(item));
  if (const json* s = present(j, "store")) {
    if (!s->is_boolean()) throw invalid_param("store", "must be a boolean");
    r.store = s->get<bool>();
  }
  if (const json* b = present(j, "background")) {
    if (!b->is_boolean()) throw invalid_param("background", "must be a boolean");
    r.background = b->get<bool>();
    // Its state and events live in the store until the client reads them.
    if (r.background && !r.store) throw invalid_param("background", "requires store: true");
  }

  // The chat request it amounts to; parse_chat_request validates it with the chat rules.
  json chat = json::object();
  json messages = json::array();
  json instructions = nullptr;
  if (const json* v = present(j, "instructions")) {
    if (!v->is_string()) throw invalid_param("instructions", "must be a string");
    instructions = *v;
    messages.push_back({{"role", "system"}, {"content", *v}});  // this turn only, as OpenAI does
  }
  for (auto& m : conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);
  if (const json* model = present(j, "model")) chat["model"] = *model;
  json tools = json::array();
  if (const json* v = present(j, "tools")) {
    tools = *v;
    chat["tools"] = chat_tools(*v);
  }
  json tool_choice = "auto";
  if (const json* v = present(j, "tool_choice")) {
    tool_choice = *v;
    if (v->is_object() && v->contains("name")) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*v)["name"]}}}};
    } else {
      chat["tool_choice"] = *v;
    }
  }
  if (const json* v = present(j, "max_output_tokens")) chat["max_tokens"] = *v;
  // Logprobs of the answer's text, as OpenAI and vLLM return them: asked for by `include`, with
  // `top_logprobs` alternatives per token (the chat rules check the count).
  if (const json* v = present(j, "include")) {
    if (!v->is_array() || !std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_string(); }))
      throw invalid_param("include", "must be an array of strings");
    if (std::find(v->begin(), v->end(), json("message.output_text.logprobs")) != v->end()) {
      chat["logprobs"] = true;
      if (const json* top = present(j, "top_logprobs")) chat["top_logprobs"] = *top;
    }
  }
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "parallel_tool_calls", "stream",
                          "user", "presence_penalty", "frequency_penalty", "repetition_penalty"}) {
    if (const json* v = present(j, key)) chat[key] = *v;
  }
  json text = {{"format", {{"type", "text"}}}};
  if (const json* v = present(j, "text")) {
    if (!v->is_object()) throw invalid_param("text", "must be an object");
    if (const json* format = present(*v, "format")) {
      text = *v;
      const json* type = format->is_object() ? present(*format, "type") : nullptr;
      if (type && *type == "json_schema") {
        json schema = {{"name", format->value("name", "response")}};
        if (const json* s = present(*format, "schema")) schema["schema"] = *s;
        if (const json* s = present(*format, "strict")) schema["strict"] = *s;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else if (type && (*type == "json_object" || *type == "text")) {
        chat["response_format"] = {{"type", *type}};
      } else {
        throw invalid_param("text.format", "must be of type text, json_object or json_schema");
      }
    }
  }
  if (const json* v = present(j, "chat_template_kwargs"))
    chat["chat_template_kwargs"] = *v;  // vLLM's extension
  if (const json* v = present(j, "reasoning")) {
    if (!v->is_object()) throw invalid_param("reasoning", "must be an object");
    // Effort "none" (OpenAI's no-reasoning setting) is the template's thinking switch; other efforts think.
    if (const json* effort = present(*v, "effort"); effort && *effort == "none") {
      chat["chat_template_kwargs"]["enable_thinking"] = false;
    }
  }
  r.chat = parse_chat_request(chat.dump(-1, ' ', false, json::error_handler_t::replace));

  r.conversation = std::move(conversation);
  r.input_items = std::move(input_items);
  const json* metadata = present(j, "metadata");
  r.echo = {{"background", r.background},
            {"instructions", instructions},
            {"max_output_tokens", present(j, "max_output_tokens") ? j["max_output_tokens"] : json(nullptr)},
            {"metadata", metadata ? *metadata : json::object()},
            {"parallel_tool_calls", r.chat.parallel_tool_calls},
            {"previous_response_id", r.previous_response_id ? json(*r.previous_response_id) : json(nullptr)},
            {"reasoning",
             present(j, "reasoning") ? j["reasoning"] : json{{"effort", nullptr}, {"summary", nullptr}}},
            {"store", r.store},
            {"temperature", present(j, "temperature") ? j["temperature"] : json(1.0)},
            {"text", text},
            {"tool_choice", tool_choice},
            {"tools", tools},
            {"top_logprobs", present(j, "top_logprobs") ? j["top_logprobs"] : json(nullptr)},
            {"top_p", present(j, "top_p") ? j["top_p"] : json(1.0)},
            {"truncation", "disabled"},
            {"user", present(j, "user") ? j["user"] : json(nullptr)}};
  return r;
}

json stored_input_items(const ResponsesRequest& request, const std::string& response_id) {
  json items = request.input_items;
  for (size_t i = 0; i < items.size(); ++i) {
    json& item = items[i];
    if (item.contains("id")) continue;
    const std::string type = item.value("type", "");
    const char* kind = type == "function_call"          ? "fc"
                       : type == "function_call_output" ? "fco"
                       : type == "reasoning"            ? "rs"
                                                        : "msg";
    // "in" is no hex digit, so these never meet an output item's id (kind, hex, counter).
    item["id"] = fmt::format("{}_{}in{}", kind, response_id.substr(5), i);
  }
  return items;
}

}  // namespace moeserve::server
