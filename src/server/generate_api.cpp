#include "server/generate_api.h"

#include <fmt/format.h>

#include <chrono>
#include <string>

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// Writes an answer as SGLang's /generate does: per choice {"text", "output_ids", "meta_info"}; whole, one
// object (a list for a batch or n > 1); streamed, a `data:` chunk per new tokens with everything so far
// (SGLang's default) or, with --incremental-streaming-output, only the new text, ids and output logprobs
// (the counts in meta_info and the prompt's logprobs stay whole, as SGLang writes them), "index" naming the
// choice of a batch, then [DONE].
class GenerateEncoder : public ResponseEncoder {
 public:
  explicit GenerateEncoder(const EncoderContext& ctx) : ctx_(ctx) {}

  std::string delta(const ChoiceOutput& c, const ChoiceDelta& d) override {
    if (!d.new_tokens() && !d.finished) return "";
    json chunk = choice_json(c, d.finished, options().incremental ? &d : nullptr);
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

  // `only` (incremental streaming): the text, ids and output logprobs of this delta alone.
  json choice_json(const ChoiceOutput& c, bool finished, const ChoiceDelta* only = nullptr) const {
    const auto& prompt = ctx_.spec.prompts[size_t(c.prompt_index())];
    json meta = {{"id", id_of(c)},
                 {"finish_reason", finished ? finish_reason(c) : json(nullptr)},
                 {"prompt_tokens", prompt.size()},
                 {"completion_tokens", c.tokens().size()},
                 {"cached_tokens", c.cached_tokens()}};
    const size_t from = only ? only->tokens_from : 0, to = only ? only->tokens_to : c.tokens().size();
    if (options().logprobs) add_logprobs(meta, c, prompt, from, to);
    if (finished) {
      meta["e2e_latency"] = std::chrono::duration<double>(Clock::now() - ctx_.spec.arrival).count();
    }
    const std::vector<int32_t> ids(c.tokens().begin() + std::ptrdiff_t(from),
                                   c.tokens().begin() + std::ptrdiff_t(to));
    return {
        {"text", only ? only->text.content : c.text()}, {"output_ids", ids}, {"meta_info", std::move(meta)}};
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

  // The output's logprobs of tokens [from, to), and the prompt's.
  void add_logprobs(json& meta, const ChoiceOutput& c, const std::vector<int32_t>& prompt, size_t from,
                    size_t to) const {
    const bool with_top = ctx_.spec.logprobs.value_or(0) > 0;
    json output = json::array(), output_top = json::array();
    for (size_t i = from; i < to && i < c.logprobs().size(); ++i) {
      const LogprobEntry& e = c.logprobs()[i];
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
