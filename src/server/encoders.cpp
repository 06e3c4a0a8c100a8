#include "server/encoders.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/generate_api.h"
#include "server/messages_api.h"
#include "server/responses_api.h"
#include "text/tokenizer.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

std::string sse(const json& j) {
  std::string out = "data: ";
  out += j.dump(-1, ' ', false, json::error_handler_t::replace);
  out += "\n\n";
  return out;
}

std::string token_text(const text::Tokenizer* tokenizer, int32_t id) {
  if (!tokenizer) return fmt::format("token_id:{}", id);
  try {
    return tokenizer->token_bytes(id);
  } catch (const std::exception&) {
    return fmt::format("token_id:{}", id);
  }
}

json usage_json(const JobSpec& spec, const std::vector<ChoiceOutput>& choices) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t p = 0; p < spec.prompts.size(); ++p) {
    prompt += static_cast<int64_t>(spec.prompts[p].size());
    int64_t prompt_cached = 0;
    for (auto& c : choices) {
      if (c.prompt_index() == static_cast<int>(p)) prompt_cached = std::max(prompt_cached, c.cached_tokens());
    }
    cached += prompt_cached;
  }
  for (auto& c : choices) completion += static_cast<int64_t>(c.tokens().size());
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

namespace {

// vLLM renamed reasoning_content to reasoning; clients read either, so both are sent.
json with_reasoning_alias(json j) {
  if (auto it = j.find("reasoning_content"); it != j.end()) j["reasoning"] = *it;
  return j;
}

// The parts both OpenAI formats share: the chunk envelope and the end of the stream.
class OpenAiEncoder : public ResponseEncoder {
 public:
  OpenAiEncoder(const EncoderContext& ctx, const char* chunk_object)
      : ctx_(ctx), chunk_object_(chunk_object), started_(ctx.choices.size(), false) {}

  std::string stream_end(const std::string& error) override {
    std::string out;
    if (!error.empty()) out += sse(json::parse(error_json(ApiError(500, error, "server_error"))));
    if (ctx_.spec.stream.include_usage) out += sse(envelope(json::array(), true));
    out += "data: [DONE]\n\n";
    return out;
  }

 protected:
  json envelope(json choices, bool usage) const {
    json j = {{"id", ctx_.spec.id},
              {"object", chunk_object_},
              {"created", ctx_.spec.created},
              {"model", ctx_.model},
              {"choices", std::move(choices)}};
    if (usage) j["usage"] = usage_json(ctx_.spec, ctx_.choices);
    return j;
  }
  std::string chunk(json choice) const {
    return sse(envelope(json::array({std::move(choice)}), ctx_.spec.stream.continuous_usage_stats));
  }
  std::string text_of(int32_t id) const { return token_text(ctx_.tokenizer, id); }
  // Logprobs or token ids were asked for: tokens whose text is not out yet (no tokenizer, a partial UTF-8
  // character) still make a chunk, or they would be lost from the stream.
  bool shows_tokens() const { return ctx_.spec.logprobs.has_value() || ctx_.spec.return_token_ids; }

  EncoderContext ctx_;
  const char* chunk_object_;
  std::vector<bool> started_;  // per choice: its first chunk (role / echo) is out
};

class CompletionEncoder : public OpenAiEncoder {
 public:
  explicit CompletionEncoder(const EncoderContext& ctx)
      : OpenAiEncoder(ctx, "text_completion"), offsets_(ctx.choices.size(), 0) {}

  std::string delta(const ChoiceOutput& c, const ChoiceDelta& d) override {
    const JobSpec& spec = ctx_.spec;
    std::string text;
    json lp = spec.logprobs ? empty_logprobs() : json(nullptr);
    size_t& offset = offsets_[size_t(c.index())];
    if (!started_[size_t(c.index())]) {
      started_[size_t(c.index())] = true;
      if (spec.echo) {
        text = spec.prompt_texts[size_t(c.prompt_index())];
        if (spec.logprobs) append_prompt_logprobs(lp, c, offset);
      }
    }
    text += d.text.content;
    if (spec.logprobs) append_logprobs(lp, c.logprobs(), d.tokens_from, d.tokens_to, offset);
    if (text.empty() && !d.finished && !(shows_tokens() && d.new_tokens())) return "";
    json choice = {{"index", c.index()},
                   {"text", std::move(text)},
                   {"logprobs", std::move(lp)},
                   {"finish_reason", d.finished ? json(c.finish_reason()) : json(nullptr)}};
    if (d.finished) choice["stop_reason"] = c.stop_reason();
    if (spec.return_token_ids) {
      choice["token_ids"] =
          std::vector<int32_t>(c.tokens().begin() + std::ptrdiff_t(d.tokens_from), c.tokens().end());
    }
    return chunk(std::move(choice));
  }

  std::string whole() override {
    const JobSpec& spec = ctx_.spec;
    json choices = json::array();
    for (const auto& c : ctx_.choices) {
      json choice = {{"index", c.index()}};
      choice["text"] = (spec.echo ? spec.prompt_texts[size_t(c.prompt_index())] : std::string()) + c.text();
      json lp = nullptr;
      if (spec.logprobs) {
        lp = empty_logprobs();
        size_t offset = 0;
        if (spec.echo) append_prompt_logprobs(lp, c, offset);
        append_logprobs(lp, c.logprobs(), 0, c.logprobs().size(), offset);
      }
      choice["logprobs"] = std::move(lp);
      choice["finish_reason"] = c.finish_reason();
      choice["stop_reason"] = c.stop_reason();
      if (spec.return_token_ids) {
        choice["token_ids"] = c.tokens();
        choice["prompt_token_ids"] = spec.prompts[size_t(c.prompt_index())];
      }
      choices.push_back(std::move(choice));
    }
    json j = {
        {"id", spec.id},       {"object", "text_completion"},   {"created", spec.created},
        {"model", ctx_.model}, {"choices", std::move(choices)}, {"usage", usage_json(spec, ctx_.choices)}};
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  static json empty_logprobs() {
    return json{{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
  }

  // Appends the legacy logprobs of entries [from, to) to `lp`, advancing the text offset.
  void append_logprobs(json& lp, const std::vector<LogprobEntry>& entries, size_t from, size_t to,
                       size_t& offset) const {
    for (size_t i = from; i < to && i < entries.size(); ++i) {
      const auto& e = entries[i];
      std::string tok = text_of(e.token);
      lp["tokens"].push_back(tok);
      lp["text_offset"].push_back(offset);
      offset += tok.size();
      lp["token_logprobs"].push_back(e.logprob);
      json top = json::object();
      if (e.top.empty()) top[tok] = e.logprob;
      for (auto& t : e.top) top[text_of(t.token)] = t.logprob;
      lp["top_logprobs"].push_back(top);
    }
  }

  // echo + logprobs: every prompt token, the first with null logprobs (nothing predicts it), the rest from
  // the engine's prompt logprobs (positions 1..n-1).
  void append_prompt_logprobs(json& lp, const ChoiceOutput& c, size_t& offset) const {
    const auto& prompt = ctx_.spec.prompts[size_t(c.prompt_index())];
    const auto& entries = c.prompt_logprobs();
    for (size_t i = 0; i < prompt.size(); ++i) {
      std::string tok = text_of(prompt[i]);
      lp["tokens"].push_back(tok);
      lp["text_offset"].push_back(offset);
      offset += tok.size();
      if (i == 0 || i - 1 >= entries.size()) {
        lp["token_logprobs"].push_back(nullptr);
        lp["top_logprobs"].push_back(nullptr);
        continue;
      }
      const auto& e = entries[i - 1];
      lp["token_logprobs"].push_back(e.logprob);
      json top = json::object();
      top[tok] = e.logprob;
      for (auto& t : e.top) top[text_of(t.token)] = t.logprob;
      lp["top_logprobs"].push_back(top);
    }
  }

  std::vector<size_t> offsets_;  // per choice: text_offset of its next token
};

class ChatEncoder : public OpenAiEncoder {
 public:
  explicit ChatEncoder(const EncoderContext& ctx) : OpenAiEncoder(ctx, "chat.completion.chunk") {}

  std::string delta(const ChoiceOutput& c, const ChoiceDelta& d) override {
    std::string out;
    if (!started_[size_t(c.index())]) {
      started_[size_t(c.index())] = true;
      out += choice_chunk(c, json{{"role", "assistant"}, {"content", ""}}, false, 0, 0);
    }
    json delta = with_reasoning_alias(d.text.to_openai());
    if (!delta.empty() || (shows_tokens() && d.new_tokens())) {
      out += choice_chunk(c, std::move(delta), false, d.tokens_from, d.tokens_to);
    }
    if (d.finished) out += choice_chunk(c, json::object(), true, 0, 0);
    return out;
  }

  std::string whole() override {
    const JobSpec& spec = ctx_.spec;
    json choices = json::array();
    for (const auto& c : ctx_.choices) {
      json choice = {{"index", c.index()}};
      choice["message"] = with_reasoning_alias(c.message().to_openai());
      choice["logprobs"] = spec.logprobs ? logprobs_json(c, 0, c.tokens().size()) : json(nullptr);
      choice["finish_reason"] = c.finish_reason();
      choice["stop_reason"] = c.stop_reason();
      if (spec.return_token_ids) choice["token_ids"] = c.tokens();
      choices.push_back(std::move(choice));
    }
    json j = {
        {"id", spec.id},       {"object", "chat.completion"},   {"created", spec.created},
        {"model", ctx_.model}, {"choices", std::move(choices)}, {"usage", usage_json(spec, ctx_.choices)}};
    if (spec.return_token_ids) j["prompt_token_ids"] = spec.prompts[0];
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  std::string choice_chunk(const ChoiceOutput& c, json delta, bool finish, size_t from, size_t to) const {
    json choice = {{"index", c.index()},
                   {"delta", std::move(delta)},
                   {"logprobs", nullptr},
                   {"finish_reason", finish ? json(c.finish_reason()) : json(nullptr)}};
    if (ctx_.spec.logprobs && to > from) choice["logprobs"] = logprobs_json(c, from, to);
    if (finish) choice["stop_reason"] = c.stop_reason();
    if (ctx_.spec.return_token_ids && to > from) {
      choice["token_ids"] = std::vector<int32_t>(c.tokens().begin() + std::ptrdiff_t(from),
                                                 c.tokens().begin() + std::ptrdiff_t(to));
    }
    return chunk(std::move(choice));
  }

  json logprobs_json(const ChoiceOutput& c, size_t from, size_t to) const {
    return json{{"content", token_logprobs(ctx_.tokenizer, c.logprobs(), from, to)}};
  }
};

}  // namespace

json token_logprobs(const text::Tokenizer* tokenizer, const std::vector<LogprobEntry>& entries, size_t from,
                    size_t to) {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  };
  json content = json::array();
  for (size_t i = from; i < to && i < entries.size(); ++i) {
    const auto& e = entries[i];
    std::string tok = token_text(tokenizer, e.token);
    json top = json::array();
    for (auto& t : e.top) {
      std::string s = token_text(tokenizer, t.token);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
    }
    content.push_back(
        {{"token", tok}, {"logprob", e.logprob}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}});
  }
  return content;
}

std::unique_ptr<ResponseEncoder> make_encoder(const EncoderContext& ctx) {
  switch (ctx.spec.kind) {
    case JobSpec::Kind::kCompletion:
      return std::make_unique<CompletionEncoder>(ctx);
    case JobSpec::Kind::kChat:
      return std::make_unique<ChatEncoder>(ctx);
    case JobSpec::Kind::kResponses:
      return make_responses_encoder(ctx);
    case JobSpec::Kind::kMessages:
      return make_messages_encoder(ctx);
    case JobSpec::Kind::kGenerate:
      return make_generate_encoder(ctx);
  }
  return nullptr;
}

}  // namespace moeserve::server
