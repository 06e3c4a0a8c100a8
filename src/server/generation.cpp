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

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

GenerationJob::GenerationJob(GenerationContext& ctx, JobSpec spec) : ctx_(ctx), spec_(std::move(spec)) {
  int total = static_cast<int>(spec_.prompts.size()) * spec_.n;
  choices_.reserve(size_t(total));
  for (int i = 0; i < total; ++i) {
    const size_t prompt = size_t(i / spec_.n);
    const JobSpec::PromptSampling* own = spec_.per_prompt.empty() ? nullptr : &spec_.per_prompt.at(prompt);
    text::StreamingOptions text;
    text.stops = own ? own->stop : spec_.stop;
    text.include_stop_str_in_output =
        own ? own->include_stop_str_in_output : spec_.include_stop_str_in_output;
    text.skip_special_tokens = own ? own->skip_special_tokens : spec_.skip_special_tokens;
    text.parser = spec_.parser;
    text.assistant_prefix = spec_.assistant_prefix;
    choices_.emplace_back(i, i / spec_.n, ctx_.tokenizer, std::move(text), !spec_.parallel_tool_calls);
    slots_.emplace_back().id = fmt::format("{}-{}", spec_.id, i);
  }
  encoder_ = make_encoder({spec_, ctx_.model_name, ctx_.tokenizer, choices_});
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
    r.id = slots_[size_t(c.index())].id;
    r.prompt = spec_.prompts[size_t(c.prompt_index())];
    // Completions: a snapshot before the last prompt token, so the same prompt again is a hit (the engine
    // alone would file one on the second run, for the third).
    r.snapshot_hint =
        spec_.kind == JobSpec::Kind::kChat ? spec_.snapshot_hint : static_cast<int64_t>(r.prompt.size()) - 1;
    r.images = spec_.images;
    r.params = spec_.per_prompt.empty() ? spec_.params : spec_.per_prompt.at(size_t(c.prompt_index())).params;
    r.priority = spec_.priority;
    if (r.params.seed) r.params.seed = *r.params.seed + static_cast<uint64_t>(c.index());
    int index = c.index();
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
  for (auto& slot : slots_) {
    if (!slot.done) ctx_.engine->cancel(slot.id);
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
    if (!c.finished()) ctx_.metrics->request_finished("abort");
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

// Metrics: tokens as the engine produced them.
void GenerationJob::observe_tokens(EngineSlot& slot, const Event& ev) {
  if (ev.out.tokens.empty()) return;
  auto k = static_cast<double>(ev.out.tokens.size());
  if (!slot.last_token_at) {
    ctx_.metrics->ttft.observe(seconds(ev.at - spec_.arrival));
  } else {
    double gap = seconds(ev.at - *slot.last_token_at) / k;
    for (size_t i = 0; i < ev.out.tokens.size(); ++i) ctx_.metrics->itl.observe(gap);
  }
  slot.last_token_at = ev.at;
  ctx_.metrics->generation_tokens.inc(k);
}

void GenerationJob::process(Event& ev, std::string& sse_out) {
  ChoiceOutput& c = choices_[size_t(ev.choice)];
  EngineSlot& slot = slots_[size_t(ev.choice)];
  if (ev.out.finished) slot.done = true;
  if (c.finished()) return;  // already ended by a stop string; the engine's abort event is expected
  observe_tokens(slot, ev);
  ChoiceDelta d = c.push(ev.out);
  if (c.cut_by_stop_string() && !slot.done) ctx_.engine->cancel(slot.id);
  if (spec_.stream.stream) sse_out += encoder_->delta(c, d);
}

void GenerationJob::complete(Step& step) {
  auto now = Clock::now();
  ctx_.metrics->e2e.observe(seconds(now - spec_.arrival));
  for (auto& p : spec_.prompts)
    ctx_.metrics->prompt_tokens_per_request.observe(static_cast<double>(p.size()));
  std::string error;
  for (auto& c : choices_) {
    ctx_.metrics->generation_tokens_per_request.observe(static_cast<double>(c.tokens().size()));
    ctx_.metrics->request_finished(c.finish_reason());
    if (!c.error().empty()) error = c.error();
  }
  if (spec_.stream.stream) {
    step.data += encoder_->stream_end(error);
  } else if (!error.empty()) {
    HttpResponse r = error_response(500, error);
    ctx_.metrics->request_error(500);
    step.head = Head{r.status, r.content_type, r.headers, false};
    step.data = std::move(r.body);
  } else {
    step.head = Head{200, "application/json", {}, false};
    step.data = encoder_->whole();
  }
  step.done = true;
  done_ = true;
  release();
}

AsyncBody::Step GenerationJob::poll(Clock::time_point now) {
  Step step{};
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
          ApiError e(
              503,
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
      step.head =
          Head{200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}, true};
      head_sent_ = true;
    }
  }
  for (auto& ev : events) process(ev, step.data);
  bool all = true;
  for (auto& c : choices_) all = all && c.finished();
  if (all) complete(step);
  return step;
}

}  // namespace moeserve::server
