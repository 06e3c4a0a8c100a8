#include "server/openai_service.h"

#include <cstdlib>
#include <ctime>
#include <limits>

#include "common/log.h"
#include "engine/json_constraint.h"
#include "server/api_error.h"
#include "server/generate_api.h"
#include "server/generate_request.h"
#include "server/messages_api.h"
#include "server/messages_request.h"
#include "server/request_checks.h"
#include "server/responses_api.h"
#include "server/vllm_metrics.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "vision/multimodal.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

HttpResponse json_response(const json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

// An X-Request-Id worth echoing: what tracing proxies send (a UUID, a hex id), not a header-sized blob.
constexpr size_t kMaxRequestIdBytes = 256;

SamplingParams to_engine(const SamplingSettings& s) {
  SamplingParams p;
  p.temperature = static_cast<float>(s.temperature);
  p.top_p = static_cast<float>(s.top_p);
  p.top_k = s.top_k;
  p.min_p = static_cast<float>(s.min_p);
  p.presence_penalty = static_cast<float>(s.presence_penalty);
  p.frequency_penalty = static_cast<float>(s.frequency_penalty);
  p.repetition_penalty = static_cast<float>(s.repetition_penalty);
  p.seed = s.seed;
  p.max_tokens = s.max_tokens;
  p.min_tokens = s.min_tokens;
  p.ignore_eos = s.ignore_eos;
  p.stop_token_ids = s.stop_token_ids;
  p.logit_bias = s.logit_bias;
  return p;
}

// n choices, each with the request's stop strings and stream settings.
void set_choices(JobSpec& spec, int n, const SamplingSettings& sampling, const StreamSettings& stream) {
  spec.n = n;
  spec.stop = sampling.stop;
  spec.include_stop_str_in_output = sampling.include_stop_str_in_output;
  spec.skip_special_tokens = sampling.skip_special_tokens;
  spec.stream = stream;
}

}  // namespace

OpenAiService::OpenAiService(ServiceOptions options, Engine* engine, const text::Tokenizer* tokenizer,
                             Admission& admission, ServerMetrics& metrics)
    : options_(std::move(options)),
      engine_(engine),
      max_model_len_(options_.max_model_len),
      tokenizer_(tokenizer),
      admission_(admission),
      metrics_(metrics),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  ctx_.engine = engine;
  ctx_.tokenizer = tokenizer;
  ctx_.admission = &admission;
  ctx_.metrics = &metrics;
  ctx_.model_name = options_.served_model_name;
}

void OpenAiService::set_engine(Engine* engine, int64_t max_model_len) {
  ctx_.engine = engine;
  max_model_len_ = max_model_len;
  engine_ = engine;
}

std::string api_key_from_environment(const std::string& flag, std::string* source) {
  auto from = [&](std::string key, const char* where) {
    if (source) *source = where;
    return key;
  };
  if (!flag.empty()) return from(flag, "--api-key");
  for (const char* name : {"MOESERVE_API_KEY", "VLLM_API_KEY"}) {
    const char* value = std::getenv(name);
    if (value && *value) return from(value, name);
  }
  return from("", "");
}

std::vector<std::string> parse_allowed_origins(const std::string& flag) {
  std::vector<std::string> out;
  if (flag.empty()) return out;
  if (flag.front() == '[') {
    json list = json::parse(flag, nullptr, false);
    check(list.is_array(), "--allowed-origins: '{}' is not a JSON list of strings", flag);
    for (auto& v : list) {
      check(v.is_string(), "--allowed-origins: '{}' is not a JSON list of strings", flag);
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  for (size_t at = 0; at <= flag.size();) {
    size_t end = std::min(flag.find(',', at), flag.size());
    if (end > at) out.push_back(flag.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

void OpenAiService::configure(HttpServerOptions& http) {
  http.on_head = [this](const HttpRequest& head) {
    auto denied = check_head(head);
    if (denied) metrics_.request_error(denied->status);
    return denied;
  };
  http.runs_inline = &OpenAiService::runs_inline;
}

std::optional<HttpResponse> OpenAiService::check_head(const HttpRequest& req) const {
  auto error = api_key_error(req, options_.api_key, !options_.allowed_origins.empty());
  if (!error) return std::nullopt;
  return error_response(*error);
}

Reply OpenAiService::handle(HttpRequest& request) {
  auto t0 = Clock::now();
  Reply reply;
  try {
    // Already checked from the head when configure() installed the hook; checked here too, so a server
    // wired without it is never open.
    if (auto answer = preflight(request)) {
      reply.response = std::move(*answer);
    } else if (auto denied = check_head(request)) {
      reply.response = std::move(*denied);
    } else {
      reply = route(request);
    }
  } catch (const ApiError& e) {
    reply.response = error_response(e);
  } catch (const nlohmann::json::exception& e) {
    // A JSON value of the wrong type in a field read without a typed check: the client's input.
    reply.response = error_response(400, std::string("invalid request body: ") + e.what());
  } catch (const std::exception& e) {
    // Input that got past validation and still broke something: an answer, never a crash.
    spdlog::error("{} {}: {}", request.method, request.path, e.what());
    reply.response = error_response(500, std::string("internal error: ") + e.what());
  }
  if (!reply.body && reply.response.status >= 400) metrics_.request_error(reply.response.status);
  if (auto id = request.header("x-request-id"); !id.empty() && id.size() <= kMaxRequestIdBytes) {
    reply.headers.emplace_back("X-Request-Id", std::string(id));
  }
  for (auto& h : cors_headers(request)) reply.headers.push_back(std::move(h));
  spdlog::debug("{} {} {} -> {} ({:.2f} ms{})", request.remote, request.method, request.path,
                reply.body ? 200 : reply.response.status,
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                reply.body ? ", streaming or deferred" : "");
  return reply;
}

Reply OpenAiService::route(HttpRequest& req) {
  const std::string& p = req.path;
  auto method_is = [&](const char* m) {
    if (req.method != m) {
      throw ApiError(405, fmt::format("{} {} is not allowed; use {}", req.method, p, m),
                     "method_not_allowed");
    }
  };
  Reply r;
  if (p == "/health" || p == "/v1/health") {
    method_is("GET");
    r.response = health();
  } else if (p == "/ping") {
    // SageMaker's health probe, which vLLM and SGLang serve: GET or POST.
    if (req.method != "POST") method_is("GET");
    r.response = health();
  } else if (p == "/health_generate") {
    method_is("GET");
    return health_generate();
  } else if (p == "/get_model_info") {
    method_is("GET");
    r.response = model_info();
  } else if (p == "/reset_prefix_cache" || p == "/flush_cache") {
    // vLLM's and SGLang's names; behind the API key, since a flush costs every client its cache hits.
    if (req.method != "GET") method_is("POST");
    check_generation_ready();
    engine_.load()->flush_cache();
    r.response = json_response({{"status", "ok"}});
  } else if (p == "/metrics") {
    method_is("GET");
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = metrics_.registry().render();
    if (options_.vllm_metrics) r.response.body += vllm_metric_families(r.response.body);
  } else if (p == "/version") {
    method_is("GET");
    r.response = json_response({{"version", options_.version}});
  } else if (p == "/v1/models" || p.rfind("/v1/models/", 0) == 0) {
    method_is("GET");
    r.response = models(p.size() > 11 ? p.substr(11) : "");
  } else if (p == "/v1/completions") {
    method_is("POST");
    return completions(req);
  } else if (p == "/v1/chat/completions") {
    method_is("POST");
    return chat_completions(req);
  } else if (p == "/v1/responses") {
    method_is("POST");
    return responses(req);
  } else if (p.starts_with("/v1/responses/")) {
    return stored_response_request(response_store_, req, std::string_view(p).substr(14));
  } else if (p == "/v1/messages") {
    method_is("POST");
    return messages(req);
  } else if (p == "/v1/messages/count_tokens") {
    method_is("POST");
    r.response = count_message_tokens(req);
  } else if (p == "/generate") {
    method_is("POST");
    return generate(req);
  } else if (p == "/tokenize" || p == "/v1/tokenize") {
    method_is("POST");
    r.response = tokenize(req);
  } else if (p == "/detokenize" || p == "/v1/detokenize") {
    method_is("POST");
    r.response = detokenize(req);
  } else {
    throw ApiError(404, fmt::format("no route for {} {}", req.method, p), "not_found_error");
  }
  return r;
}

void OpenAiService::check_model(const std::optional<std::string>& model) const {
  if (model && !model->empty() && *model != options_.served_model_name) {
    throw ApiError(404,
                   fmt::format("the model '{}' does not exist; this server serves '{}'", *model,
                               options_.served_model_name),
                   "not_found_error", "model", "model_not_found");
  }
}

void OpenAiService::check_generation_ready() const {
  if (draining_)
    throw ApiError(503, "the server is shutting down and accepts no new requests", "service_unavailable");
  if (!ready_ || !engine_.load()) {
    ApiError e(503, "the model is still loading; retry shortly", "service_unavailable");
    e.retry_after_s = 5;
    throw e;
  }
}

void OpenAiService::note_ignored(const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::lock_guard lock(ignored_mutex_);
  for (const auto& name : names) {
    // Bounded: a client inventing names must not grow the set without end.
    if (ignored_logged_.size() < kMaxIgnoredNamesLogged && ignored_logged_.insert(name).second) {
      spdlog::debug("ignoring the request parameter '{}' (unknown to this server; logged once)", name);
    }
  }
}

ServedModel OpenAiService::served() const {
  ServedModel m;
  m.max_model_len = max_model_len_.load();
  if (Engine* engine = engine_.load()) m.vocab = engine->vocab_size();
  if (tokenizer_) m.vocab = std::min<int64_t>(m.vocab, int64_t(tokenizer_->vocab_size()));
  m.has_tokenizer = tokenizer_ != nullptr;
  m.has_chat_template = options_.chat_template != nullptr;
  m.tool_call_parser = options_.tool_call_parser;
  return m;
}

int OpenAiService::engine_priority(int request_priority) const {
  if (!options_.enable_priority) return 0;
  if (!options_.priority_larger_first) return request_priority;
  // -INT_MIN does not exist; the smallest request value becomes the largest engine value all the same.
  return request_priority == std::numeric_limits<int>::min() ? std::numeric_limits<int>::max()
                                                             : -request_priority;
}

JobSpec OpenAiService::new_spec(JobSpec::Kind kind, const char* id_prefix) const {
  JobSpec spec;
  spec.kind = kind;
  spec.id = random_id(id_prefix);
  spec.created = static_cast<int64_t>(std::time(nullptr));
  spec.arrival = Clock::now();
  spec.queue_timeout = options_.queue_timeout;
  return spec;
}

HttpResponse OpenAiService::health() const {
  if (draining_) return error_response(503, "draining: the server is shutting down");
  if (!ready_) return error_response(503, "loading: the model is not ready yet");
  if (Engine* e = engine_.load(); e && !e->alive()) return error_response(503, "the engine has stopped");
  HttpResponse r;
  r.content_type = "application/json";
  r.body = "{\"status\":\"ok\"}";
  return r;
}

HttpResponse OpenAiService::model_info() const {
  json preferred = nullptr;
  const SamplingDefaults& d = options_.sampling_defaults;
  if (!d.empty()) {
    preferred = json::object();
    if (d.temperature) preferred["temperature"] = *d.temperature;
    if (d.top_p) preferred["top_p"] = *d.top_p;
    if (d.top_k) preferred["top_k"] = *d.top_k;
    if (d.min_p) preferred["min_p"] = *d.min_p;
    if (d.repetition_penalty) preferred["repetition_penalty"] = *d.repetition_penalty;
  }
  // SGLang's fields, which its router and clients read.
  return json_response(
      {{"model_path", options_.model_path},
       {"tokenizer_path", options_.tokenizer_path.empty() ? options_.model_path : options_.tokenizer_path},
       {"is_generation", true},
       {"served_model_name", options_.served_model_name},
       {"max_model_len", max_model_len_.load()},
       {"preferred_sampling_params", preferred}});
}

// One real engine step: a one-token greedy completion of token 0 through admission and the engine, so a
// wedged engine thread or a broken backend fails this probe where /health still answers.
Reply OpenAiService::health_generate() {
  check_generation_ready();
  JobSpec spec = new_spec(JobSpec::Kind::kCompletion, "health-");
  spec.prompts = {{0}};
  spec.prompt_texts = {""};
  spec.params.temperature = 0;
  spec.params.max_tokens = 1;
  return start_job(std::move(spec));
}

Headers OpenAiService::cors_headers(const HttpRequest& req) const {
  std::string_view origin = req.header("origin");
  if (options_.allowed_origins.empty() || origin.empty()) return {};
  const auto& allowed = options_.allowed_origins;
  bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!any && std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return {};
  // Credentials are never allowed (vLLM's default), so "*" may be sent as it is.
  return {{"Access-Control-Allow-Origin", any ? "*" : std::string(origin)}, {"Vary", "Origin"}};
}

std::optional<HttpResponse> OpenAiService::preflight(const HttpRequest& req) const {
  if (req.method != "OPTIONS" || options_.allowed_origins.empty() ||
      req.header("access-control-request-method").empty()) {
    return std::nullopt;
  }
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  if (cors_headers(req).empty()) {
    r.status = 400;
    r.body = "Disallowed CORS origin";
    return r;
  }
  r.body = "OK";
  r.headers = {{"Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"},
               {"Access-Control-Max-Age", "600"}};
  // Any header may be sent (vLLM allows "*"), so the ones the browser asks for are granted.
  if (auto asked = req.header("access-control-request-headers"); !asked.empty()) {
    r.headers.emplace_back("Access-Control-Allow-Headers", std::string(asked));
  }
  return r;
}

HttpResponse OpenAiService::models(const std::string& id) const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "moeserve"},
                {"root", options_.model_path},
                {"parent", nullptr},
                {"max_model_len", max_model_len_.load()}};
  if (!id.empty()) {
    check_model(id);
    return json_response(model);
  }
  return json_response({{"object", "list"}, {"data", json::array({model})}});
}

// Where the last message of a ChatML prompt opens (its final <|im_start|>, the generation prompt): the next
// turn of this conversation repeats everything before it, so the engine keeps a GDN snapshot there.
int64_t OpenAiService::turn_boundary(const std::vector<int32_t>& prompt) const {
  auto im_start = tokenizer_->token_id("<|im_start|>");
  if (!im_start) return 0;
  auto last = std::find(prompt.rbegin(), prompt.rend(), *im_start);
  return last == prompt.rend() ? 0 : int64_t(prompt.rend() - last) - 1;
}

std::vector<int32_t> OpenAiService::encode(const std::string& text, bool add_special_tokens,
                                           const char* param) const {
  check_tokenizer(served(), param);
  return tokenizer_->encode(text, add_special_tokens);
}

HttpResponse OpenAiService::tokenize(const HttpRequest& req) {
  json body = parse_json_object(req.body);
  if (body.contains("model") && body["model"].is_string()) check_model(body["model"].get<std::string>());
  bool add_special = body.value("add_special_tokens", true);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    check_chat_template(served());
    // Reuse the chat validation: the same body shape minus generation parameters.
    json chat = {{"messages", body["messages"]}};
    for (const char* key :
         {"tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"}) {
      if (body.contains(key)) chat[key] = body[key];
    }
    ChatRequest cr = parse_chat_request(chat.dump());
    ids = encode(render_chat(cr, nullptr), /*add_special_tokens=*/false, "messages");
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    ids = encode(body["prompt"].get<std::string>(), add_special, "prompt");
  } else {
    throw invalid_param("prompt", "send a string 'prompt' or a 'messages' array");
  }
  json out = {{"count", ids.size()}, {"max_model_len", max_model_len_.load()}, {"tokens", ids}};
  if (body.value("return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(tokenizer_->id_to_token(id).value_or(""));
    out["token_strs"] = strs;
  }
  return json_response(out);
}

HttpResponse OpenAiService::detokenize(const HttpRequest& req) {
  json body = parse_json_object(req.body);
  if (body.contains("model") && body["model"].is_string()) check_model(body["model"].get<std::string>());
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    throw invalid_param("tokens", "must be an array of token ids");
  }
  const ServedModel model = served();
  check_tokenizer(model, "tokens");
  std::vector<int32_t> ids;
  for (auto& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      throw invalid_param("tokens", "{} is not a token id", brief(t));
    }
    ids.push_back(t.get<int32_t>());
  }
  check_token_ids(model, "tokens", ids);
  return json_response({{"prompt", tokenizer_->decode(ids, false)}});
}

std::shared_ptr<const JsonConstraint> OpenAiService::json_constraint(
    const ResponseFormat& format, std::optional<int32_t> start_after_token) {
  if (!format.schema) return nullptr;
  check_tokenizer(served(), "response_format");
  check_generation_ready();
  auto c = std::make_shared<JsonConstraint>();
  c->schema = format.schema;
  c->start_after_token = start_after_token;
  {
    std::lock_guard lock(token_bytes_mutex_);
    if (!token_bytes_) {
      // Each id's bytes as the detokenizer emits them; added tokens (<|im_end|>, <think>, <tool_call>, ...)
      // are control tokens and never part of JSON.
      auto t = std::make_shared<TokenBytes>();
      const size_t n = std::min<size_t>(tokenizer_->vocab_size(), size_t(engine_.load()->vocab_size()));
      t->bytes.resize(n);
      t->usable.resize(n);
      for (size_t id = 0; id < n; ++id) {
        t->bytes[id] = tokenizer_->token_bytes(int32_t(id));
        t->usable[id] = !t->bytes[id].empty() && !tokenizer_->is_added(int32_t(id));
      }
      token_bytes_ = std::move(t);
    }
    c->vocab = token_bytes_;
  }
  return c;
}

std::shared_ptr<GenerationJob> OpenAiService::admitted_job(JobSpec spec) {
  auto job = std::make_shared<GenerationJob>(ctx_, std::move(spec));
  job->admit();  // throws 429/503 when refused outright
  {
    std::lock_guard lock(jobs_mutex_);
    std::erase_if(jobs_, [](auto& w) {
      auto j = w.lock();
      return !j || j->finished();
    });
    jobs_.push_back(job);
  }
  return job;
}

Reply OpenAiService::start_job(JobSpec spec) {
  check_generation_ready();  // after validation: a bad request is a 400 even while loading
  Reply r;
  r.body = admitted_job(std::move(spec));
  return r;
}

Reply OpenAiService::start_background(JobSpec spec) {
  check_generation_ready();
  const bool stream = spec.stream.stream;
  spec.stream.stream = true;  // the encoder's events are the record's
  const std::string id = spec.id;
  auto record = std::make_shared<BackgroundResponse>(queued_response(spec, options_.served_model_name),
                                                     stored_input_items(*spec.responses, id));
  spec.background = record;
  response_store_.start_background(id, record);  // 429 when too many run
  std::shared_ptr<GenerationJob> job;
  try {
    job = admitted_job(std::move(spec));
  } catch (...) {
    response_store_.erase(id);
    throw;
  }
  const uint64_t task = background_.run(job, [record](int status, const std::string& body) {
    // Refused after admission (the queue timed out, the engine would not take it): the error's message.
    if (status >= 400) {
      json error = json::parse(body, nullptr, false);
      record->fail(error.is_object() && error.contains("error") ? error["error"].value("message", body)
                                                                : body);
    }
  });
  record->set_stop([this, task] { background_.cancel(task); });
  Reply r;
  if (stream) {
    r.body = background_event_stream(record, -1);
  } else {
    r.response = json_response(record->snapshot());
  }
  return r;
}

Reply OpenAiService::completions(HttpRequest& req) {
  CompletionRequest cr = parse_completion_request(req.body);
  return start_job(
      completion_job(cr, JobSpec::Kind::kCompletion, "cmpl-", options_.default_completion_max_tokens));
}

Reply OpenAiService::generate(HttpRequest& req) {
  SglangGenerateRequest gr = parse_generate_request(req.body);
  auto job = [&](CompletionRequest& cr) {
    return completion_job(cr, JobSpec::Kind::kGenerate, "generate-", kGenerateDefaultMaxNewTokens);
  };
  JobSpec spec;
  if (gr.per_prompt.empty()) {
    spec = job(gr.completion);
  } else {
    // Per-prompt sampling: each prompt's job under its own parameters, run as one batch (the shared
    // fields, n included, are the same in each).
    for (size_t i = 0; i < gr.per_prompt.size(); ++i) {
      JobSpec one = job(gr.per_prompt[i]);
      JobSpec::PromptSampling sampling{one.params, one.stop, one.include_stop_str_in_output,
                                       one.skip_special_tokens};
      if (i == 0) {
        spec = std::move(one);  // its id, arrival and shared fields stand for the batch
      } else {
        spec.prompts.push_back(std::move(one.prompts[0]));
        spec.prompt_texts.push_back(std::move(one.prompt_texts[0]));
      }
      spec.per_prompt.push_back(std::move(sampling));
    }
  }
  spec.generate = std::move(gr.options);
  spec.generate.incremental = options_.incremental_streaming_output;
  return start_job(std::move(spec));
}

JobSpec OpenAiService::completion_job(CompletionRequest& cr, JobSpec::Kind kind, const char* id_prefix,
                                      int default_max_tokens) {
  note_ignored(cr.ignored);
  check_model(cr.model);
  const ServedModel model = served();
  if (!cr.sampling.stop.empty()) check_tokenizer(model, "stop");
  JobSpec spec = new_spec(kind, id_prefix);
  for (auto& prompt : cr.prompts) {
    if (auto* text = std::get_if<std::string>(&prompt)) {
      spec.prompts.push_back(encode(*text, true, "prompt"));
      spec.prompt_texts.push_back(*text);
    } else {
      auto& ids = std::get<std::vector<int32_t>>(prompt);
      check_token_ids(model, "prompt", ids);
      spec.prompt_texts.push_back(tokenizer_ ? tokenizer_->decode(ids, false) : "");
      spec.prompts.push_back(ids);
    }
  }
  if (!cr.images.empty()) spec.images = load_images(cr.images, cr.mm_processor_kwargs, spec.prompts[0]);
  bool explicit_max_tokens = cr.sampling.max_tokens.has_value();
  options_.sampling_defaults.apply(cr.sampling);
  spec.params = to_engine(cr.sampling);
  if (!explicit_max_tokens) {
    // The API's default (OpenAI's 16, SGLang's 128), clipped to the room the longest prompt leaves (an
    // explicit max_tokens over the context is an error instead).
    int64_t max_tokens = default_max_tokens;
    for (auto& p : spec.prompts) {
      if (model.max_model_len > 0) {
        max_tokens = std::min<int64_t>(max_tokens, model.max_model_len - static_cast<int64_t>(p.size()));
      }
    }
    spec.params.max_tokens = static_cast<int>(std::max<int64_t>(max_tokens, 1));
  }
  if (cr.logprobs) {
    spec.params.logprobs = true;
    spec.params.top_logprobs = *cr.logprobs;
    if (cr.echo) spec.params.prompt_logprobs = *cr.logprobs;
  }
  if (cr.prompt_logprobs) spec.params.prompt_logprobs = *cr.prompt_logprobs;
  spec.params.json = json_constraint(cr.response_format, std::nullopt);
  for (auto& p : spec.prompts) check_context_length(model, p.size(), spec.params.max_tokens, "prompt");
  check_sampling_token_ids(model, spec.params);
  spec.priority = engine_priority(cr.priority);
  set_choices(spec, cr.n, cr.sampling, cr.stream);
  spec.echo = cr.echo;
  spec.return_token_ids = cr.return_token_ids;
  spec.logprobs = cr.logprobs;
  return spec;
}

Reply OpenAiService::chat_completions(HttpRequest& req) {
  ChatRequest cr = parse_chat_request(req.body);
  return start_job(chat_job(cr, "chatcmpl-"));
}

Reply OpenAiService::messages(HttpRequest& req) {
  ChatRequest cr = parse_messages_request(req.body);
  JobSpec spec = chat_job(cr, "msg_");
  spec.kind = JobSpec::Kind::kMessages;
  return start_job(std::move(spec));
}

Reply OpenAiService::responses(HttpRequest& req) {
  auto rr = std::make_shared<ResponsesRequest>(parse_responses_request(req.body, response_store_));
  JobSpec spec = chat_job(rr->chat, "resp_");
  spec.kind = JobSpec::Kind::kResponses;
  spec.responses = rr;
  spec.response_store = &response_store_;
  return rr->background ? start_background(std::move(spec)) : start_job(std::move(spec));
}

OpenAiService::ChatPrompt OpenAiService::chat_prompt(const ChatRequest& cr) {
  note_ignored(cr.ignored);
  check_model(cr.model);
  const ServedModel model = served();
  check_chat_template(model);
  check_tool_calls(model, cr.tool_choice != ToolChoice::kNone);
  ChatPrompt p;
  p.text = render_chat(cr, &p.forced_prefix);
  p.ids = encode(p.text + p.forced_prefix, /*add_special_tokens=*/false, "messages");
  if (!cr.images.empty()) p.images = load_images(cr.images, cr.mm_processor_kwargs, p.ids);
  return p;
}

HttpResponse OpenAiService::count_message_tokens(HttpRequest& req) {
  ChatRequest cr = parse_messages_request(req.body, MessagesBody::kCountTokens);
  return json_response({{"input_tokens", chat_prompt(cr).ids.size()}});
}

JobSpec OpenAiService::chat_job(ChatRequest& cr, const char* id_prefix) {
  const ServedModel model = served();
  const bool tools_on = cr.tool_choice != ToolChoice::kNone;
  ChatPrompt chat = chat_prompt(cr);
  const std::string& prompt = chat.text;
  const std::string& forced_prefix = chat.forced_prefix;
  JobSpec spec = new_spec(JobSpec::Kind::kChat, id_prefix);
  spec.prompts.push_back(std::move(chat.ids));
  spec.images = std::move(chat.images);
  spec.snapshot_hint = turn_boundary(spec.prompts[0]);
  spec.prompt_texts.push_back(prompt + forced_prefix);
  spec.assistant_prefix = forced_prefix;
  options_.sampling_defaults.apply(cr.sampling);
  spec.params = to_engine(cr.sampling);
  if (cr.logprobs) {
    spec.params.logprobs = true;
    spec.params.top_logprobs = cr.top_logprobs;
    spec.logprobs = cr.top_logprobs;
  }
  check_context_length(model, spec.prompts[0].size(), spec.params.max_tokens, "messages");
  check_sampling_token_ids(model, spec.params);
  spec.priority = engine_priority(cr.priority);
  set_choices(spec, cr.n, cr.sampling, cr.stream);
  spec.return_token_ids = cr.return_token_ids;
  text::OutputParserOptions parser;
  parser.reasoning_parser = options_.reasoning_parser;
  parser.tool_parser = tools_on ? options_.tool_call_parser : "";
  parser.starts_in_reasoning = !options_.reasoning_parser.empty() && text::prompt_opens_reasoning(prompt);
  if (tools_on) parser.tools = cr.tools;
  spec.parallel_tool_calls = cr.parallel_tool_calls;
  if (!parser.reasoning_parser.empty() || !parser.tool_parser.empty()) spec.parser = parser;
  if (cr.response_format.schema) {
    if (!forced_prefix.empty()) {
      throw invalid_param("response_format",
                          "cannot be combined with tool_choice 'required' or a named tool");
    }
    // A prompt that opens the model's reasoning: the JSON is the content after </think> (as vLLM applies
    // structured output once the reasoning parser sees the reasoning end); the reasoning itself is free.
    std::optional<int32_t> after;
    if (parser.starts_in_reasoning) {
      after = tokenizer_->token_id("</think>");
      if (!after)
        throw invalid_param("response_format", "the prompt opens reasoning, but </think> is not a token");
    }
    spec.params.json = json_constraint(cr.response_format, after);
  }
  // A forced call (render_chat wrote its opening) is constrained to one well-formed call in the parser's
  // format: the function's name where "required" leaves the choice among several tools, then arguments that
  // validate against the function's parameters as the parser reads them back, then the call's end.
  if (!forced_prefix.empty()) {
    std::optional<std::string> written;  // the name the opening already holds
    if (cr.tool_choice == ToolChoice::kNamed) written = cr.tool_choice_name;
    if (cr.tool_choice == ToolChoice::kRequired && cr.tools.size() == 1)
      written = cr.tools[0]["function"]["name"].get<std::string>();
    std::vector<JsonSchema::Function> functions;
    for (const auto& t : cr.tools) {
      const json& fn = t["function"];
      if (written && fn["name"] != *written) continue;
      const bool given = fn.contains("parameters") && fn["parameters"].is_object();
      functions.push_back(
          {fn["name"].get<std::string>(), given ? fn["parameters"] : json{{"type", "object"}}});
    }
    const auto format = options_.tool_call_parser == "hermes" ? JsonSchema::CallFormat::kHermes
                                                              : JsonSchema::CallFormat::kQwenXml;
    ResponseFormat call;
    try {
      call.schema = JsonSchema::tool_call(functions, format, written.has_value());
    } catch (const SchemaError& e) {
      throw invalid_param("tools", "{}", e.what());
    }
    auto c = std::make_shared<JsonConstraint>(*json_constraint(call, std::nullopt));
    if (auto close = tokenizer_->token_id("</tool_call>")) c->control_tokens.push_back(*close);
    spec.params.json = std::move(c);
  }
  return spec;
}

std::shared_ptr<const PromptImages> OpenAiService::load_images(const std::vector<ImagePart>& parts,
                                                               const ImageResize& resize,
                                                               std::vector<int32_t>& prompt) {
  if (!options_.image_processor) throw invalid_param(parts[0].param, "{}", options_.images_off);
  if (int64_t(parts.size()) > options_.max_images_per_prompt) {
    throw invalid_param(parts[size_t(options_.max_images_per_prompt)].param,
                        "at most {} image(s) may be provided in one prompt (--limit-mm-per-prompt), got {}",
                        options_.max_images_per_prompt, parts.size());
  }
  auto images = std::make_shared<PromptImages>();
  images->image_token = options_.image_token_id;
  std::vector<ImageGrid> grids;
  // The request's own resize bounds (vLLM's mm_processor_kwargs), each within the server's: they decide
  // what an image costs, so a request may ask for fewer pixels than the server allows, never more.
  ImageProcessorConfig processor = *options_.image_processor;
  const int64_t lowest = processor.min_pixels, highest = processor.max_pixels;
  for (auto [value, key] : {std::pair{resize.min_pixels, "min_pixels"}, {resize.max_pixels, "max_pixels"}}) {
    if (value && (*value < lowest || *value > highest)) {
      throw invalid_param(
          fmt::format("mm_processor_kwargs.{}", key),
          "{} is outside this server's image pixel bounds [{}, {}] (--mm-processor-kwargs, or "
          "the checkpoint's preprocessor_config.json)",
          *value, lowest, highest);
    }
  }
  if (resize.min_pixels) processor.min_pixels = *resize.min_pixels;
  if (resize.max_pixels) processor.max_pixels = *resize.max_pixels;
  if (processor.min_pixels > processor.max_pixels) {
    throw invalid_param("mm_processor_kwargs", "min_pixels {} is above max_pixels {}", processor.min_pixels,
                        processor.max_pixels);
  }
  const int merge = processor.merge_size;
  // The request's patch budget, spent image by image from each header's size (the processor's smart_resize
  // target) before its pixels are decoded.
  const int64_t context = served().max_model_len, context_patches = context * merge * merge;
  const bool context_bound = context > 0 && context_patches < options_.max_image_patches_per_request;
  const int64_t budget = context_bound ? context_patches : options_.max_image_patches_per_request;
  int64_t patches = 0;
  auto spend = [&](const ImageInfo& info) {
    auto [h, w] = smart_resize(int(std::min<int64_t>(info.height, std::numeric_limits<int>::max())),
                               int(std::min<int64_t>(info.width, std::numeric_limits<int>::max())),
                               processor.factor(), processor.min_pixels, processor.max_pixels);
    const int64_t n = int64_t(h / processor.patch_size) * (w / processor.patch_size);
    if (patches + n > budget) {
      throw ImageError(fmt::format(
          "the {}x{} image becomes {} vision patches ({} image tokens); with the request's images before it "
          "that is {} patches, over {}",
          info.width, info.height, n, n / (merge * merge), patches + n,
          context_bound
              ? fmt::format("the {} the {}-token context holds", budget, context)
              : fmt::format("the limit of {} per request (--max-image-patches-per-request)", budget)));
    }
    patches += n;
  };
  for (const ImagePart& part : parts) {
    try {
      LoadedImage loaded = load_image_url(part.url, options_.image_fetch, spend);
      PromptImage& image = images->images.emplace_back();
      image.patches = preprocess_image(loaded.image, processor);
      image.hash = loaded.hash;
      grids.push_back({image.patches.grid_h / merge, image.patches.grid_w / merge});
    } catch (const Error& e) {  // ImageError, or a preprocessing check: the image's fault either way
      throw invalid_param(part.param, "{}", e.what());
    }
  }
  const size_t placeholders = size_t(std::count(prompt.begin(), prompt.end(), options_.image_token_id));
  if (placeholders != grids.size()) {
    throw invalid_param(parts[0].param, "the prompt has {} image placeholders (token {}) for {} images",
                        placeholders, options_.image_token_id, grids.size());
  }
  prompt = expand_image_placeholders(prompt, options_.image_token_id, grids);
  metrics_.images.inc(double(grids.size()));
  return images;
}

std::string OpenAiService::render_chat(const ChatRequest& cr, std::string* forced_prefix) const {
  bool tools_on = cr.tool_choice != ToolChoice::kNone && !cr.tools.empty();
  json tools = tools_on ? cr.tools : json(nullptr);
  std::string prompt;
  try {
    if (cr.continue_final_message) {
      // Render the conversation closed, then cut after the final message's text so the model continues it
      // (vLLM's continue_final_message).
      prompt = options_.chat_template->render(cr.messages, tools, false, cr.chat_template_kwargs);
      const json& last = cr.messages.back()["content"];
      std::string text = last.is_string() ? last.get<std::string>() : "";
      size_t at = text.empty() ? std::string::npos : prompt.rfind(text);
      if (at == std::string::npos) {
        throw invalid_param("continue_final_message", "the template does not show the final message's text");
      }
      prompt.resize(at + text.size());
    } else {
      prompt = options_.chat_template->render(cr.messages, tools, cr.add_generation_prompt,
                                              cr.chat_template_kwargs);
    }
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("the chat template failed on these messages: {}", e.what()),
                   "invalid_request_error", "messages");
  }
  if (forced_prefix && (cr.tool_choice == ToolChoice::kRequired || cr.tool_choice == ToolChoice::kNamed)) {
    // The call's opening is written into the assistant turn (chat_job constrains the rest). A prompt that
    // ends inside <think> is closed first, as the non-thinking template form does. A named function (or
    // "required" with a single tool, which can only mean that one) is written out; "required" with several
    // tools stops before the name, which the model chooses among the tools.
    if (text::prompt_opens_reasoning(prompt)) prompt += "\n</think>\n\n";
    std::optional<std::string> name;
    if (cr.tool_choice == ToolChoice::kNamed) name = cr.tool_choice_name;
    if (cr.tool_choice == ToolChoice::kRequired && cr.tools.size() == 1) {
      name = cr.tools[0]["function"]["name"].get<std::string>();
    }
    const bool hermes = options_.tool_call_parser == "hermes";
    std::string prefix = "<tool_call>\n";
    if (name) {
      prefix += hermes ? fmt::format("{{\"name\": {}, \"arguments\": ", json(*name).dump())
                       : fmt::format("<function={}>\n", *name);
    } else {
      prefix += hermes ? "{\"name\": \"" : "<function=";
    }
    *forced_prefix = prefix;
  }
  return prompt;
}

void OpenAiService::begin_drain() {
  draining_ = true;
  admission_.set_draining(true);
}

size_t OpenAiService::in_flight() {
  std::lock_guard lock(jobs_mutex_);
  size_t n = 0;
  for (auto& w : jobs_) {
    if (auto j = w.lock(); j && !j->finished()) ++n;
  }
  return n;
}

void OpenAiService::abort_all() {
  std::vector<std::shared_ptr<GenerationJob>> live;
  {
    std::lock_guard lock(jobs_mutex_);
    for (auto& w : jobs_) {
      if (auto j = w.lock(); j && !j->finished()) live.push_back(std::move(j));
    }
  }
  for (auto& j : live) j->abort();
}

}  // namespace moeserve::server
