#pragma once
// Everything text-related a checkpoint directory ships: tokenizer.json, tokenizer_config.json (chat
// template, special token names), chat_template.jinja and generation_config.json (stop ids).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace moeserve::text {

struct ModelText {
  Tokenizer tokenizer;
  // The default chat template: chat_template.jinja if present, else tokenizer_config.json's
  // "chat_template" (a string, or the entry named "default" of a list). Empty when there is none.
  std::string chat_template;
  std::map<std::string, std::string> named_templates;  // e.g. "tool_use" from a list-form chat_template
  std::string bos_token, eos_token, pad_token;  // token texts from tokenizer_config.json ("" when unset)
  std::optional<int32_t> bos_id, eos_id, pad_id;
  // Ids that end generation: eos_token plus generation_config.json's eos_token_id (int or list),
  // deduplicated.
  std::vector<int32_t> stop_ids;

  // Throws moeserve::Error naming the file when tokenizer.json is missing or any file is malformed.
  static ModelText load(const std::string& dir);
};

}  // namespace moeserve::text
