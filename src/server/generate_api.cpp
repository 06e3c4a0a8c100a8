#include "server/generate_api.h"

#include <fmt/format.h>

#include <chrono>
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

// The completion field's name as the /generate client wrote it, for an error from the completion rules.
std::string generate_param(const std::string& completion_param) {
  if (kSamplingFields.contains(completion_param)) return "sampling_params." + completion_param;
  for (const auto& [sglang, completion] : kSamplingFields)
    if (completion == completion_param) return "sampling_params." + sglang;
  if (completion_param == "logprobs") return "top_logprobs_num";
  if (completion_param == "prompt_logprobs") return "logprob_start_len";
  return completion_param;
}

void translate_sampling(const json& params, json& completion) {
  if (params.is_array()) {
    throw invalid_param(
        "sampling_params",
        "must be one object (per-prompt sampling_params are not supported: send the prompts in "
        "separate requests)");
  }
  if (!params.is_object()) throw invalid_param("sampling_params", "must be an object");
  for (const auto& [key, value] : params.items()) {
    if (value.is_null()) continue;  // SGLang's unset
    if (key == "json_schema" && !value.is_string()) {
      throw invalid_param("sampling_params.json_schema", "must be a JSON string");
    } else if (auto field = kSamplingFields.find(key); field != kSamplingFields.end()) {
      completion[field->second] = value;
    } else if (key == "spaces_between_special_tokens") {
      // Byte-level BPE decodes special tokens without spaces either way (as Hugging Face's fast tokenizers).
      if (!value.is_boolean()) throw invalid_param("sampling_params." + key, "must be a boolean");
    } else if (key == "ebnf" || key == "structural_tag") {
      throw invalid_param("sampling_params." + key,
                          "is not supported; constrain the output with json_schema or regex instead");
    } else {
      throw invalid_param("sampling_params." + key,
                          "is not a sampling parameter this server applies (ignoring it would change the "
                          "answer)");
    }
  }
}

}  // namespace

GenerateRequest parse_generate_request(std::string_view body) {
  json j = parse_json_object(body);
  GenerateRequest r;
  json completion = json::object();
  const json* text = present(j, "text");
  const json* ids = present(j, "input_ids");
  if ((text != nullptr) == (ids != nullptr)) throw invalid_param("text", "give either text or input_ids");
  const json& prompt = text ? *text : *ids;
  const char* prompt_param = text ? "text" : "input_ids";
  if (prompt.is_array() && prompt.empty()) throw invalid_param(prompt_param, "must not be empty");
  // A list of texts, or a list of id lists, is a batch: answered with a list even when it holds one.
  r.options.batch = prompt.is_array() && (text || prompt[0].is_array());
  completion["prompt"] = prompt;
  if (const json* params = present(j, "sampling_params")) translate_sampling(*params, completion);
  if (const json* v = present(j, "stream")) completion["stream"] = *v;
  if (const json* v = present(j, "image_data")) completion["image_data"] = *v;
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
  try {
    r.completion = parse_completion_request(completion.dump(-1, ' ', false, json::error_handler_t::replace));
  } catch (const ApiError& e) {
    if (!e.param) throw;
    // The completion rules name their own field: the message and param name the client's.
    const std::string named = *e.param == "prompt" ? prompt_param : generate_param(*e.param);
    std::string message = e.what();
    if (const std::string quoted = "'" + *e.param + "'"; message.starts_with(quoted))
      message = "'" + named + "'" + message.substr(quoted.size());
    throw ApiError(e.status, message, e.type, named, e.code);
  }
  return r;
}

namespace {

// Writes an answer as SGLang's /generate does: per choice {"text", "output_ids", "meta_info"}; whole, one
// object (a list for a batch or n > 1); streamed, a `data:` chunk per new tokens with everything so far
// (SGLang's default, non-incremental streaming), "index" naming the choice of a batch, then [DONE].
class GenerateEncoder : public ResponseEncoder {
 public:
  explicit GenerateEncoder(const EncoderContext& ctx) : ctx_(ctx) {}

  std::string delta(const ChoiceOutput& c, const ChoiceDelta& d) override {
    if (!d.new_tokens() && !d.finished) return "";
    json chunk = choice_json(c, d.finished);
    if (list_answer()) chunk["index"] = c.index();
    return sse(chunk);
  }

  std::string stream_end(const std::string& error) override {
    std::string out;
    if (!error.empty()) out += sse(json{{"error", {{"message", error}}}});
    return out + "data: [DONE]\n\n";
  }

  std::string whole() override {
    json answer = json::array();
    for (const auto& c : ctx_.choices) answer.push_back(choice_json(c, true));
    if (!list_answer()) answer = std::move(answer[0]);
    return answer.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  const GenerateOptions& options() const { return ctx_.spec.generate; }
  bool list_answer() const { return options().batch || ctx_.choices.size() > 1; }

  json choice_json(const ChoiceOutput& c, bool finished) const {
    const auto& prompt = ctx_.spec.prompts[size_t(c.prompt_index())];
    json meta = {{"id", id_of(c)},
                 {"finish_reason", finished ? finish_reason(c) : json(nullptr)},
                 {"prompt_tokens", prompt.size()},
                 {"completion_tokens", c.tokens().size()},
                 {"cached_tokens", c.cached_tokens()}};
    if (options().logprobs) add_logprobs(meta, c, prompt);
    if (finished) {
      meta["e2e_latency"] = std::chrono::duration<double>(Clock::now() - ctx_.spec.arrival).count();
    }
    return {{"text", c.text()}, {"output_ids", c.tokens()}, {"meta_info", std::move(meta)}};
  }

  // The client's rid (each choice of a list gets its index appended), else the job's id.
  std::string id_of(const ChoiceOutput& c) const {
    const std::string& base = options().rid.empty() ? ctx_.spec.id : options().rid;
    return list_answer() ? fmt::format("{}_{}", base, c.index()) : base;
  }

  // SGLang's finish reasons: {"type": "stop", "matched": the stop string or token id}, {"type": "length",
  // "length": tokens}, {"type": "abort", "message"}.
  static json finish_reason(const ChoiceOutput& c) {
    const std::string& f = c.finish_reason();
    if (f == "length") return {{"type", "length"}, {"length", c.tokens().size()}};
    if (f == "stop") {
      json matched = c.stop_reason();  // a stop string or stop token id; null: the end-of-sequence token
      if (matched.is_null() && !c.tokens().empty()) matched = c.tokens().back();
      return {{"type", "stop"}, {"matched", std::move(matched)}};
    }
    return {{"type", "abort"}, {"message", c.error().empty() ? f : c.error()}};
  }

  // [logprob, token id, text or null], as SGLang's *_token_logprobs entries.
  json entry(double logprob, int32_t token) const {
    return json::array(
        {logprob, token,
         options().text_in_logprobs ? json(token_text(ctx_.tokenizer, token)) : json(nullptr)});
  }
  json top_entries(const LogprobEntry& e) const {
    json top = json::array();
    for (const auto& t : e.top) top.push_back(entry(t.logprob, t.token));
    return top;
  }

  void add_logprobs(json& meta, const ChoiceOutput& c, const std::vector<int32_t>& prompt) const {
    const bool with_top = ctx_.spec.logprobs.value_or(0) > 0;
    json output = json::array(), output_top = json::array();
    for (const auto& e : c.logprobs()) {
      output.push_back(entry(e.logprob, e.token));
      if (with_top) output_top.push_back(top_entries(e));
    }
    meta["output_token_logprobs"] = std::move(output);
    if (with_top) meta["output_top_logprobs"] = std::move(output_top);
    if (options().logprob_start_len < 0) return;
    // The prompt's from logprob_start_len on; nothing predicts its first token (null, as SGLang writes it).
    json input = json::array(), input_top = json::array();
    const auto& entries = c.prompt_logprobs();
    for (size_t i = size_t(options().logprob_start_len); i < prompt.size(); ++i) {
      if (i == 0 || i - 1 >= entries.size()) {
        input.push_back(json::array(
            {nullptr, prompt[i],
             options().text_in_logprobs ? json(token_text(ctx_.tokenizer, prompt[i])) : json(nullptr)}));
        input_top.push_back(nullptr);
        continue;
      }
      input.push_back(entry(entries[i - 1].logprob, prompt[i]));
      input_top.push_back(top_entries(entries[i - 1]));
    }
    meta["input_token_logprobs"] = std::move(input);
    if (with_top) meta["input_top_logprobs"] = std::move(input_top);
  }

  EncoderContext ctx_;
};

}  // namespace

std::unique_ptr<ResponseEncoder> make_generate_encoder(const EncoderContext& ctx) {
  return std::make_unique<GenerateEncoder>(ctx);
}

}  // namespace moeserve::server
