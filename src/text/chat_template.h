#pragma once
// Chat templates as Hugging Face's apply_chat_template renders them (tokenize=False).

#include <nlohmann/json.hpp>
#include <string>

#include "text/jinja.h"

namespace moeserve::text {

class ChatTemplate {
 public:
  // Parses the template; a syntax error is a jinja::TemplateError naming the line.
  explicit ChatTemplate(const std::string& source, std::string bos_token = "", std::string eos_token = "");

  // Renders `messages` (a JSON array of {role, content, ...}). `tools` is the OpenAI tools array or null
  // (then the template sees None). `kwargs` (a JSON object, e.g. {"enable_thinking": false}) become
  // template variables too, as chat_template_kwargs do in vLLM/SGLang. The template's own
  // raise_exception and runtime errors come out as jinja::TemplateError (the server answers 400).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                     bool add_generation_prompt = true,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  // OpenAI requests carry tool-call arguments as a JSON string; templates iterate them as a mapping.
  // Returns a copy of messages with every assistant tool_calls[].function.arguments string that parses
  // as a JSON object replaced by that object (as vLLM does before rendering).
  static nlohmann::ordered_json normalize_openai_messages(const nlohmann::ordered_json& messages);

 private:
  jinja::Template template_;
  std::string bos_token_, eos_token_;
};

}  // namespace moeserve::text
