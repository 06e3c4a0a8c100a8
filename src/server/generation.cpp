#include "server/generation.h"

#include <fmt/format.h>

#include <random>

#include "common/error.h"
#include "common/log.h"
#include "server/api_error.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string sse(const json& j) {
  std::string out = "data: ";
  out += j.dump(-1, ' ', false, json::error_handler_t::replace);
  out += "\n\n";
  return out;
}

}  // namespace

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

void check_context_length(const std::vector<int32_t>& prompt, const SamplingParams& params, int64_t max_model_len,
                          const char* prompt_param) {
  if (max_model_len <= 0) return;
  auto n = static_cast<int64_t>(prompt.size());
  if (n >= max_model_len) {
    throw invalid_param(prompt_param,
                        "this model's maximum context length is {} tokens, but the prompt has {} tokens (at "
                        "least one token must be left for the output)",
                        max_model_len, n);
  }
  if (params.max_tokens && n + *params.max_tokens > max_model_len) {
    throw invalid_param("max_tokens",
                        "this model's maximum context length is {} tokens, but you requested {} tokens ({} in "
                        "the prompt, {} for the completion); reduce the prompt or max_tokens",
                        max_model_len, n + *params.max_tokens, n, *params.max_tokens);
  }
}

struct GenerationJob::Choice {
  int index = 0;
  int prompt_index = 0;
  std::string engine_id;
  std::optional<text::IncrementalDetokenizer> detok;
  std::optional<text::StopStringFilter> stops;
  std::optional<text::OutputParser> parser;
  bool prefix_fed = false;

  std::vector<int32_t> tokens;
  std::vector<LogprobEntry> logprobs;
  std::vector<LogprobEntry> prompt_logprobs;
  size_t text_offset = 0;  // completions logprobs: offset of the next token's text

  std::string text;  // completions: everything emitted, echo included
  std::string content;  // chat without an output parser

  bool finished = false;
  std::atomic<bool> engine_done{false};  // read by cancel_engine_requests from other threads
  bool started = false;  // stream: first chunk (role / echo) sent
  std::string finish_reason;
  json stop_reason;  // null, a stop string, or a stop token id (vLLM's stop_reason)
  std::string error;
  int64_t cached_tokens = 0;
  std::optional<Clock::time_point> last_token_at;
};

GenerationJob::GenerationJob(GenerationContext& ctx, JobSpec spec) : ctx_(ctx), spec_(std::move(spec)) {
  int total = static_cast<int>(spec_.prompts.size()) * spec_.n;
  for (int i = 0; i < total; ++i) {
    auto c = std::make_unique<Choice>();
    c->index = i;
    c->prompt_index = i / spec_.n;
    c->engine_id = fmt::format("{}-{}", spec_.id, i);
    if (ctx_.tokenizer) {
      c->detok.emplace(*ctx_.tokenizer, spec_.skip_special_tokens);
      if (!spec_.stop.empty()) c->stops.emplace(spec_.stop);
    }
    if (spec_.kind == JobSpec::Kind::kChat && spec_.parser) c->parser.emplace(*spec_.parser);
    choices_.push_back(std::move(c));
  }
}

GenerationJob::~GenerationJob() {
  if (!done_) cancel_engine_requests();
}

void GenerationJob::admit() {
  if (spec_.queue_timeout.count() > 0) queue_deadline_ = spec_.arrival + spec_.queue_timeout;
  std::weak_ptr<GenerationJob> weak = shared_from_this();
  ticket_ = ctx_.admission->enter(static_cast<int>(choices_.size()), [weak] {
    if (auto job = weak.lock()) job->on_admitted();
  });
}

void GenerationJob::on_admitted() {
  auto now = Clock::now();
  ctx_.metrics->queue_time.observe(seconds(now - spec_.arrival));
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  std::string error;
  for (auto& c : choices_) {
    GenerateRequest r;
    r.id = c->engine_id;
    r.prompt = spec_.prompts[c->prompt_index];
    // Completions: a snapshot before the last prompt token, so the same prompt again is a hit (the engine
    // alone would file one on the second run, for the third).
    r.snapshot_hint = spec_.kind == JobSpec::Kind::kChat ? spec_.snapshot_hint
                                                         : static_cast<int64_t>(r.prompt.size()) - 1;
    r.params = spec_.params;
    r.priority = spec_.priority;
    if (r.params.seed) r.params.seed = *r.params.seed + static_cast<uint64_t>(c->index);
    int index = c->index;
    r.on_output = [weak, index](const GenerateOutput& out) {
      if (auto job = weak.lock()) job->deliver(index, out);
    };
    try {
      ctx_.engine->submit(std::move(r));
    } catch (const std::exception& e) {
      error = e.what();
      break;
    }
  }
  if (!error.empty()) cancel_engine_requests();
  for (auto& p : spec_.prompts) ctx_.metrics->prompt_tokens.inc(static_cast<double>(p.size()));
  std::function<void()> wake;
  bool abort_now;
  {
    std::lock_guard lock(mutex_);
    admitted_ = true;
    admitted_at_ = now;
    submit_error_ = error;
    abort_now = abort_requested_;
    wake = wake_;
  }
  if (abort_now) cancel_engine_requests();
  if (wake) wake();
}

void GenerationJob::deliver(int choice, const GenerateOutput& out) {
  std::function<void()> wake;
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(Event{choice, out, Clock::now()});
    wake = wake_;
  }
  if (wake) wake();
}

void GenerationJob::start(std::function<void()> wake) {
  bool pending;
  {
    std::lock_guard lock(mutex_);
    wake_ = std::move(wake);
    pending = !inbox_.empty() || admitted_;
  }
  if (pending) wake_();
}

void GenerationJob::cancel_engine_requests() {
  if (!ctx_.engine) return;
  for (auto& c : choices_) {
    if (!c->engine_done) ctx_.engine->cancel(c->engine_id);
  }
}

void GenerationJob::release() {
  if (ticket_) ticket_->leave();
}

void GenerationJob::cancel() {
  if (done_) return;
  cancelled_ = true;
  cancel_engine_requests();
  release();
  for (auto& c : choices_) {
    if (!c->finished) ctx_.metrics->request_finished("abort");
  }
  done_ = true;
}

void GenerationJob::abort() {
  std::function<void()> wake;
  bool admitted;
  {
    std::lock_guard lock(mutex_);
    abort_requested_ = true;
    admitted = admitted_;
    wake = wake_;
  }
  if (admitted) cancel_engine_requests();
  if (wake) wake();
}

std::string GenerationJob::token_text(int32_t id) const {
  if (!ctx_.tokenizer) return fmt::format("token_id:{}", id);
  try {
    return ctx_.tokenizer->token_bytes(id);
  } catch (const std::exception&) {
    return fmt::format("token_id:{}", id);
  }
}

json GenerationJob::chat_logprobs_json(const Choice& c, size_t from, size_t to) const {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  };
  json content = json::array();
  for (size_t i = from; i < to && i < c.logprobs.size(); ++i) {
    const auto& e = c.logprobs[i];
    std::string tok = token_text(e.token);
    json top = json::array();
    for (auto& t : e.top) {
      std::string s = token_text(t.token);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}});
    }
    content.push_back({{"token", tok}, {"logprob", e.logprob}, {"bytes", bytes_of(tok)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

// Appends the legacy (completions) logprobs of entries [from, to) to `lp`, advancing the text offset.
static void append_completion_logprobs(json& lp, const std::vector<LogprobEntry>& entries, size_t from, size_t to,
                                       size_t& offset, const std::function<std::string(int32_t)>& text_of) {
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

// echo + logprobs: every prompt token, the first with null logprobs (nothing predicts it), the rest from the
// engine's prompt logprobs (positions 1..n-1).
static void append_prompt_logprobs(json& lp, const std::vector<int32_t>& prompt, const std::vector<LogprobEntry>& entries,
                                   size_t& offset, const std::function<std::string(int32_t)>& text_of) {
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

std::string GenerationJob::chunk_json(json choice_json) {
  json j = {{"id", spec_.id},
            {"object", spec_.kind == JobSpec::Kind::kChat ? "chat.completion.chunk" : "text_completion"},
            {"created", spec_.created},
            {"model", ctx_.model_name},
            {"choices", json::array({std::move(choice_json)})}};
  if (spec_.stream.continuous_usage_stats) j["usage"] = usage_json();
  return sse(j);
}

json GenerationJob::usage_json() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t p = 0; p < spec_.prompts.size(); ++p) {
    prompt += static_cast<int64_t>(spec_.prompts[p].size());
    int64_t prompt_cached = 0;
    for (auto& c : choices_) {
      if (c->prompt_index == static_cast<int>(p)) prompt_cached = std::max(prompt_cached, c->cached_tokens);
    }
    cached += prompt_cached;
  }
  for (auto& c : choices_) completion += static_cast<int64_t>(c->tokens.size());
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void GenerationJob::process(Event& ev, std::string& sse_out) {
  Choice& c = *choices_[ev.choice];
  const GenerateOutput& out = ev.out;
  if (out.finished) c.engine_done = true;
  if (c.finished) return;  // already ended by a stop string; the engine's abort event is expected

  c.cached_tokens = std::max<int64_t>(c.cached_tokens, out.usage.cached_tokens);
  if (!out.prompt_logprobs.empty()) c.prompt_logprobs = out.prompt_logprobs;

  // Metrics: tokens as the engine produced them.
  if (!out.tokens.empty()) {
    auto k = static_cast<double>(out.tokens.size());
    if (!c.last_token_at) {
      ctx_.metrics->ttft.observe(seconds(ev.at - spec_.arrival));
    } else {
      double gap = seconds(ev.at - *c.last_token_at) / k;
      for (size_t i = 0; i < out.tokens.size(); ++i) ctx_.metrics->itl.observe(gap);
    }
    c.last_token_at = ev.at;
    ctx_.metrics->generation_tokens.inc(k);
  }

  size_t logprobs_from = c.tokens.size();
  std::string new_text;
  bool stopped = false;
  for (size_t k = 0; k < out.tokens.size(); ++k) {
    int32_t t = out.tokens[k];
    c.tokens.push_back(t);
    if (k < out.logprobs.size()) c.logprobs.push_back(out.logprobs[k]);
    if (!c.detok) continue;
    std::string piece = c.detok->push(t);
    if (c.stops) {
      new_text += c.stops->push(piece);
      if (c.stops->stopped()) {
        stopped = true;
        break;
      }
    } else {
      new_text += piece;
    }
  }
  if (!stopped && out.finished && c.detok) {
    std::string tail = c.detok->finish();
    if (c.stops) {
      new_text += c.stops->push(tail);
      if (!c.stops->stopped()) new_text += c.stops->finish();
      stopped = c.stops->stopped();
    } else {
      new_text += tail;
    }
  }
  if (stopped) {
    c.finish_reason = "stop";
    c.stop_reason = c.stops->matched();
    if (spec_.include_stop_str_in_output) new_text += c.stops->matched();
    c.finished = true;
    if (!c.engine_done) ctx_.engine->cancel(c.engine_id);
  } else if (out.finished) {
    c.finished = true;
    c.finish_reason = to_string(out.finish_reason);
    if (out.stop_token) c.stop_reason = *out.stop_token;
    if (out.finish_reason == FinishReason::Error) c.error = out.error.empty() ? "generation failed" : out.error;
  }

  bool chat = spec_.kind == JobSpec::Kind::kChat;
  bool stream = spec_.stream.stream;
  bool want_logprobs = spec_.logprobs.has_value();
  size_t logprobs_to = c.tokens.size();

  if (!chat) {
    std::string delta;
    json lp = nullptr;
    if (want_logprobs) {
      lp = json{{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    }
    auto text_of = [this](int32_t id) { return token_text(id); };
    if (spec_.echo && !c.started) {
      delta = spec_.prompt_texts[c.prompt_index];
      if (want_logprobs) append_prompt_logprobs(lp, spec_.prompts[c.prompt_index], c.prompt_logprobs, c.text_offset, text_of);
    }
    c.started = true;
    delta += new_text;
    if (want_logprobs) {
      append_completion_logprobs(lp, c.logprobs, logprobs_from, logprobs_to, c.text_offset, text_of);
    }
    c.text += delta;
    // Tokens whose text is not out yet (no tokenizer, a partial UTF-8 character) still make a chunk when the
    // client asked for their ids or logprobs, or those would be lost from the stream.
    bool new_tokens = (want_logprobs || spec_.return_token_ids) && logprobs_to > logprobs_from;
    if (stream && (!delta.empty() || c.finished || new_tokens)) {
      json choice = {{"index", c.index},
                     {"text", delta},
                     {"logprobs", lp},
                     {"finish_reason", c.finished ? json(c.finish_reason) : json(nullptr)}};
      if (c.finished) choice["stop_reason"] = c.stop_reason;
      if (spec_.return_token_ids) {
        choice["token_ids"] = std::vector<int32_t>(c.tokens.begin() + logprobs_from, c.tokens.end());
      }
      sse_out += chunk_json(std::move(choice));
    }
    return;
  }

  if (!c.prefix_fed) {
    new_text = spec_.assistant_prefix + new_text;
    c.prefix_fed = true;
  }
  text::OutputDelta d;
  if (c.parser) {
    d = c.parser->push(new_text);
    if (c.finished) {
      auto tail = c.parser->finish();
      d.reasoning_content += tail.reasoning_content;
      d.content += tail.content;
      for (auto& t : tail.tool_calls) d.tool_calls.push_back(std::move(t));
    }
  } else {
    d.content = std::move(new_text);
  }
  if (c.finished && c.finish_reason == "stop" && c.parser && !c.parser->result().tool_calls.empty()) {
    c.finish_reason = "tool_calls";
  }
  if (!c.parser) c.content += d.content;
  if (!stream) return;

  auto chunk = [&](json delta, bool finish, size_t lp_from, size_t lp_to) {
    json choice = {{"index", c.index}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                   {"finish_reason", finish ? json(c.finish_reason) : json(nullptr)}};
    if (want_logprobs && lp_to > lp_from) choice["logprobs"] = chat_logprobs_json(c, lp_from, lp_to);
    if (finish) choice["stop_reason"] = c.stop_reason;
    if (spec_.return_token_ids && lp_to > lp_from) {
      choice["token_ids"] = std::vector<int32_t>(c.tokens.begin() + lp_from, c.tokens.begin() + lp_to);
    }
    sse_out += chunk_json(std::move(choice));
  };
  if (!c.started) {
    c.started = true;
    chunk(json{{"role", "assistant"}, {"content", ""}}, false, 0, 0);
  }
  json delta = d.to_openai();
  bool has_delta = !delta.empty() || ((want_logprobs || spec_.return_token_ids) && logprobs_to > logprobs_from);
  if (has_delta) chunk(std::move(delta), false, logprobs_from, logprobs_to);
  if (c.finished) chunk(json::object(), true, 0, 0);
}

std::string GenerationJob::whole_response() {
  bool chat = spec_.kind == JobSpec::Kind::kChat;
  json choices = json::array();
  for (auto& cp : choices_) {
    Choice& c = *cp;
    json choice = {{"index", c.index}};
    if (chat) {
      json message = c.parser ? c.parser->result().to_openai() : json{{"role", "assistant"}, {"content", c.content}};
      choice["message"] = std::move(message);
      choice["logprobs"] = spec_.logprobs ? chat_logprobs_json(c, 0, c.tokens.size()) : json(nullptr);
    } else {
      choice["text"] = c.text;
      json lp = nullptr;
      if (spec_.logprobs) {
        lp = json{{"tokens", json::array()},
                  {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()},
                  {"text_offset", json::array()}};
        size_t offset = 0;
        auto text_of = [this](int32_t id) { return token_text(id); };
        if (spec_.echo) append_prompt_logprobs(lp, spec_.prompts[c.prompt_index], c.prompt_logprobs, offset, text_of);
        append_completion_logprobs(lp, c.logprobs, 0, c.logprobs.size(), offset, text_of);
      }
      choice["logprobs"] = std::move(lp);
    }
    choice["finish_reason"] = c.finish_reason;
    choice["stop_reason"] = c.stop_reason;
    if (spec_.return_token_ids) {
      choice["token_ids"] = c.tokens;
      if (!chat) choice["prompt_token_ids"] = spec_.prompts[c.prompt_index];
    }
    choices.push_back(std::move(choice));
  }
  json j = {{"id", spec_.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", spec_.created},
            {"model", ctx_.model_name},
            {"choices", std::move(choices)},
            {"usage", usage_json()}};
  if (chat && spec_.return_token_ids) j["prompt_token_ids"] = spec_.prompts[0];
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void GenerationJob::complete(Step& step) {
  auto now = Clock::now();
  ctx_.metrics->e2e.observe(seconds(now - spec_.arrival));
  for (auto& p : spec_.prompts) ctx_.metrics->prompt_tokens_per_request.observe(static_cast<double>(p.size()));
  std::string error;
  for (auto& c : choices_) {
    ctx_.metrics->generation_tokens_per_request.observe(static_cast<double>(c->tokens.size()));
    ctx_.metrics->request_finished(c->finish_reason);
    if (!c->error.empty()) error = c->error;
  }
  if (spec_.stream.stream) {
    if (!error.empty()) {
      step.data += sse(json::parse(error_json(ApiError(500, error, "server_error"))));
    }
    if (spec_.stream.include_usage) {
      json j = {{"id", spec_.id},
                {"object", spec_.kind == JobSpec::Kind::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", spec_.created},
                {"model", ctx_.model_name},
                {"choices", json::array()},
                {"usage", usage_json()}};
      step.data += sse(j);
    }
    step.data += "data: [DONE]\n\n";
  } else if (!error.empty()) {
    HttpResponse r = error_response(500, error);
    ctx_.metrics->request_error(500);
    step.head = Head{r.status, r.content_type, r.headers, false};
    step.data = std::move(r.body);
  } else {
    step.head = Head{200, "application/json", {}, false};
    step.data = whole_response();
  }
  step.done = true;
  done_ = true;
  release();
}

AsyncBody::Step GenerationJob::poll(Clock::time_point now) {
  Step step;
  if (done_) {
    step.done = true;
    return step;
  }
  std::deque<Event> events;
  bool admitted, abort_requested;
  std::string submit_error;
  {
    std::lock_guard lock(mutex_);
    events.swap(inbox_);
    admitted = admitted_;
    abort_requested = abort_requested_;
    submit_error = submit_error_;
  }
  auto fail_with = [&](const ApiError& e) {
    HttpResponse r = error_response(e);
    ctx_.metrics->request_error(r.status);
    step.head = Head{r.status, r.content_type, r.headers, false};
    step.data = std::move(r.body);
    step.done = true;
    done_ = true;
    release();
    return step;
  };
  if (!head_sent_) {
    if (!submit_error.empty()) return fail_with(ApiError(400, submit_error, "invalid_request_error"));
    if (!admitted) {
      if (abort_requested && ticket_->leave_if_queued()) {
        return fail_with(ApiError(503, "the server is shutting down", "service_unavailable"));
      }
      if (queue_deadline_ && now >= *queue_deadline_) {
        // Only a request still in the queue times out; one admitted meanwhile goes ahead.
        if (ticket_->leave_if_queued()) {
          ApiError e(503,
                     fmt::format("the request waited {:.1f} s for a free generation slot (queue timeout); retry "
                                 "later",
                                 seconds(now - spec_.arrival)),
                     "service_unavailable");
          e.retry_after_s = 1;
          return fail_with(e);
        }
      } else {
        step.wake_at = queue_deadline_;
      }
      return step;
    }
    if (spec_.stream.stream) {
      step.head = Head{200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}, true};
      head_sent_ = true;
    }
  }
  for (auto& ev : events) process(ev, step.data);
  bool all = true;
  for (auto& c : choices_) all = all && c->finished;
  if (all) complete(step);
  return step;
}

}  // namespace moeserve::server
