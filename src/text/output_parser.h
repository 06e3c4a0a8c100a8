#pragma once
// Turning generated text into an OpenAI assistant message: reasoning_content, content and tool_calls, both
// for a whole output and incrementally for streaming (deltas as OpenAI's chat.completion.chunk carries
// them). Model output is untrusted: nothing here throws on it; text that does not parse stays content.
//
//   reasoning parser "qwen3":   <think> reasoning </think> content. When the prompt already opened <think>
//                               (Qwen3.5's generation prompt), the output starts inside the reasoning.
//   tool parser "qwen3_coder":  <tool_call><function=NAME><parameter=ARG>VALUE</parameter>...</function>
//                               </tool_call>, values converted by the tool's JSON schema.
//   tool parser "hermes":       <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen3, Qwen2.5).

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::text {

struct ToolCall {
  std::string id;  // "call_" + 24 random characters
  std::string name;
  std::string arguments;  // a JSON object as a string, as OpenAI sends it
};

// One piece of a tool call in a streaming delta: the first piece of a call carries id and name, later
// pieces carry more of the arguments string. Concatenating a call's argument pieces gives its arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id, name;  // set in the call's first piece only
  std::string arguments;
};

struct OutputDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  // The OpenAI "delta" object: {"reasoning_content"?, "content"?, "tool_calls"?} with only what is present.
  nlohmann::ordered_json to_openai() const;
};

struct ParsedOutput {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  // The OpenAI "message" object: role, content (null when empty and there are tool calls),
  // reasoning_content (when any) and tool_calls (when any).
  nlohmann::ordered_json to_openai() const;
};

struct OutputParserOptions {
  std::string reasoning_parser;  // "" (none) or "qwen3"
  std::string tool_parser;       // "" (none), "qwen3_coder" or "hermes"
  // The rendered prompt ends inside an open <think> (see prompt_opens_reasoning).
  bool starts_in_reasoning = false;
  // The request's OpenAI tools array (for qwen3_coder's value conversion); null or [] when none.
  nlohmann::ordered_json tools;
};

// Names accepted for the options above; anything else is a configuration error (moeserve::Error).
void validate_parser_names(const OutputParserOptions& options);

// True when the prompt's last <think> is not followed by </think>: the model continues inside reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

class OutputParser {
 public:
  explicit OutputParser(const OutputParserOptions& options);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;

  // Feeds the next piece of generated text (as the detokenizer emits it); returns what is now certain.
  OutputDelta push(std::string_view text);
  // End of generation: releases held-back text and completes a truncated tool call where possible.
  OutputDelta finish();

  // Everything parsed so far (after finish(): the whole message).
  const ParsedOutput& result() const;

  // Parses a whole output at once; identical to push(text) + finish().
  static ParsedOutput parse(std::string_view text, const OutputParserOptions& options);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::text
