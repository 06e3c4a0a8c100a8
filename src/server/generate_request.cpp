#include "server/generate_request.h"

#include <fmt/format.h>

#include <map>
#include <string>

#include "server/api_error.h"
#include "server/body_fields.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// SGLang's sampling_params -> the completion request's fields.
const std::map<std::string, std::string, std::less<>> kSamplingFields = {
    {"max_new_tokens", "max_tokens"},
    {"min_new_tokens", "min_tokens"},
    {"no_stop_trim", "include_stop_str_in_output"},
    {"sampling_seed", "seed"},
    {"seed", "seed"},
    {"temperature", "temperature"},
    {"top_p", "top_p"},
    {"top_k", "top_k"},
    {"min_p", "min_p"},
    {"frequency_penalty", "frequency_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"repetition_penalty", "repetition_penalty"},
    {"stop", "stop"},
    {"stop_token_ids", "stop_token_ids"},
    {"ignore_eos", "ignore_eos"},
    {"skip_special_tokens", "skip_special_tokens"},
    {"n", "n"},
    {"logit_bias", "logit_bias"},
    {"regex", "regex"},
    // SGLang takes the schema as a JSON string, as vLLM's guided_json may be: that rule parses it (within
    // the JSON limits) and compiles it.
    {"json_schema", "guided_json"},
};

// The completion field's name as the /generate client wrote it, for an error from the completion rules;
// `sampling` is where its sampling parameters are ("sampling_params", or "sampling_params[i]" in a list).
std::string generate_param(const std::string& completion_param, const std::string& sampling) {
  if (kSamplingFields.contains(completion_param)) return sampling + "." + completion_param;
  for (const auto& [sglang, completion] : kSamplingFields)
    if (completion == completion_param) return sampling + "." + sglang;
  if (completion_param == "logprobs") return "top_logprobs_num";
  if (completion_param == "prompt_logprobs") return "logprob_start_len";
  return completion_param;
}

void translate_sampling(const json& params, const std::string& param, json& completion) {
  if (!params.is_object()) throw invalid_param(param, "must be an object");
  for (const auto& [key, value] : params.items()) {
    if (value.is_null()) continue;  // SGLang's unset
    if (key == "json_schema" && !value.is_string()) {
      throw invalid_param(param + ".json_schema", "must be a JSON string");
    } else if (auto field = kSamplingFields.find(key); field != kSamplingFields.end()) {
      completion[field->second] = value;
    } else if (key == "spaces_between_special_tokens") {
      // Byte-level BPE decodes special tokens without spaces either way (as Hugging Face's fast tokenizers).
      if (!value.is_boolean()) throw invalid_param(param + "." + key, "must be a boolean");
    } else if (key == "ebnf" || key == "structural_tag") {
      throw invalid_param(param + "." + key,
                          "is not supported; constrain the output with json_schema or regex instead");
    } else {
      throw invalid_param(param + "." + key,
                          "is not a sampling parameter this server applies (ignoring it would change the "
                          "answer)");
    }
  }
}

// The completion rules over `completion`; their errors name the field as the /generate client wrote it.
CompletionRequest completion_of(const json& completion, const char* prompt_param,
                                const std::string& sampling) {
  try {
    return parse_completion_request(completion.dump(-1, ' ', false, json::error_handler_t::replace));
  } catch (const ApiError& e) {
    if (!e.param) throw;
    const std::string named = *e.param == "prompt" ? prompt_param : generate_param(*e.param, sampling);
    std::string message = e.what();
    if (const std::string quoted = "'" + *e.param + "'"; message.starts_with(quoted))
      message = "'" + named + "'" + message.substr(quoted.size());
    throw ApiError(e.status, message, e.type, named, e.code);
  }
}

}  // namespace

SglangGenerateRequest parse_generate_request(std::string_view body) {
  json j = parse_json_object(body);
  SglangGenerateRequest r;
  json completion = json::object();
  const json* text = present(j, "text");
  const json* ids = present(j, "input_ids");
  if ((text != nullptr) == (ids != nullptr)) throw invalid_param("text", "give either text or input_ids");
  const json& prompt = text ? *text : *ids;
  const char* prompt_param = text ? "text" : "input_ids";
  if (prompt.is_array() && prompt.empty()) throw invalid_param(prompt_param, "must not be empty");
  // A list of texts, or a list of id lists, is a batch: answered with a list even when it holds one.
  r.options.batch = prompt.is_array() && (text || prompt[0].is_array());
  if (const json* v = present(j, "stream")) completion["stream"] = *v;
  if (const json* v = present(j, "rid")) {
    if (!v->is_string()) throw invalid_param("rid", "must be a string (one request id)");
    r.options.rid = v->get<std::string>();
  }
  if (const json* v = present(j, "return_logprob")) {
    if (!v->is_boolean()) throw invalid_param("return_logprob", "must be a boolean");
    r.options.logprobs = v->get<bool>();
  }
  if (r.options.logprobs) {
    completion["logprobs"] = present(j, "top_logprobs_num") ? j["top_logprobs_num"] : json(0);
    if (const json* v = present(j, "return_text_in_logprobs")) {
      if (!v->is_boolean()) throw invalid_param("return_text_in_logprobs", "must be a boolean");
      r.options.text_in_logprobs = v->get<bool>();
    }
    if (const json* v = present(j, "logprob_start_len")) {
      if (!v->is_number_integer() || v->get<int64_t>() < -1)
        throw invalid_param("logprob_start_len", "must be an integer, -1 for output tokens only");
      // The prompt's logprobs from this position on (SGLang's input_token_logprobs).
      if (v->get<int64_t>() >= 0) {
        r.options.logprob_start_len = v->get<int64_t>();
        completion["prompt_logprobs"] = completion["logprobs"];
      }
    }
  }
  const json* params = present(j, "sampling_params");
  if (params && params->is_array()) {
    // SGLang's per-prompt sampling_params: one object per prompt of a batch, each prompt its own request
    // under the completion rules (the fields above are shared).
    if (!r.options.batch || params->size() != prompt.size()) {
      throw invalid_param("sampling_params",
                          "a list must hold one object per prompt of the batch ({} prompt(s), {} objects)",
                          r.options.batch ? prompt.size() : 1, params->size());
    }
    if (present(j, "image_data"))
      throw invalid_param("image_data", "goes with a single prompt, not with per-prompt sampling_params");
    for (size_t i = 0; i < prompt.size(); ++i) {
      const std::string sampling = fmt::format("sampling_params[{}]", i);
      json one = completion;
      one["prompt"] = prompt[i];
      translate_sampling((*params)[i], sampling, one);
      r.per_prompt.push_back(completion_of(one, prompt_param, sampling));
      if (r.per_prompt[i].n != r.per_prompt[0].n)
        throw invalid_param(sampling + ".n", "must be the same for every prompt of a batch");
    }
    return r;
  }
  completion["prompt"] = prompt;
  if (const json* v = present(j, "image_data")) completion["image_data"] = *v;
  if (params) translate_sampling(*params, "sampling_params", completion);
  r.completion = completion_of(completion, prompt_param, "sampling_params");
  return r;
}

}  // namespace moeserve::server
