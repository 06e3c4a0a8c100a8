#include "server/response_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <vector>

#include "server/api_error.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

std::string sse_event(const json& event) {
  return fmt::format("event: {}\ndata: {}\n\n", event.value("type", ""),
                     event.dump(-1, ' ', false, json::error_handler_t::replace));
}

size_t text_bytes(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace).size();
}

}  // namespace

BackgroundResponse::BackgroundResponse(json queued, json input_items)
    : input_items_(std::move(input_items)), response_(std::move(queued)) {
  if (auto output = response_.find("output"); output != response_.end()) output_ = *output;
  append({{"type", "response.created"}, {"response", response_}});
  append({{"type", "response.queued"}, {"response", response_}});
}

void BackgroundResponse::append(const json& event) {
  json e = {{"type", event["type"]}, {"sequence_number", int64_t(events_.size())}};
  for (auto& [k, v] : event.items())
    if (k != "type" && k != "sequence_number") e[k] = v;
  events_.push_back(sse_event(e));
  bytes_ += events_.back().size();
}

std::vector<std::function<void()>> BackgroundResponse::wakers() {
  std::vector<std::function<void()>> out;
  for (auto& [id, wake] : watchers_) out.push_back(wake);
  return out;
}

void BackgroundResponse::notify(std::vector<std::function<void()>> wake) {
  for (auto& w : wake) w();
}

void BackgroundResponse::publish(const json& event) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mutex_);
    if (ended_) return;
    const std::string type = event.value("type", "");
    if (type == "response.in_progress") {
      response_["status"] = "in_progress";
    } else if (type == "response.output_item.done") {
      output_.push_back(event["item"]);
    } else if (type == "response.completed" || type == "response.incomplete" || type == "response.failed") {
      response_ = event["response"];
      output_ = response_["output"];
      ended_ = true;
    }
    append(event);
    wake = wakers();
  }
  notify(std::move(wake));
}

void BackgroundResponse::fail(const std::string& message) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mutex_);
    if (ended_) return;
    response_["status"] = "failed";
    response_["error"] = {{"code", "server_error"}, {"message", message}};
    response_["output"] = output_;
    append({{"type", "response.failed"}, {"response", response_}});
    ended_ = true;
    wake = wakers();
  }
  notify(std::move(wake));
}

bool BackgroundResponse::cancel() {
  std::function<void()> stop;
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock(mutex_);
    if (ended_) return false;
    response_["status"] = "cancelled";
    ended_ = true;
    stop = std::move(stop_);
    wake = wakers();
  }
  if (stop) stop();
  notify(std::move(wake));
  return true;
}

void BackgroundResponse::set_stop(std::function<void()> stop) {
  {
    std::lock_guard lock(mutex_);
    // Cancelled before its runner was known: stopped now instead.
    if (!ended_ || response_["status"] != "cancelled") {
      stop_ = std::move(stop);
      return;
    }
  }
  stop();
}

int64_t BackgroundResponse::next_sequence() const {
  std::lock_guard lock(mutex_);
  return int64_t(events_.size());
}

std::string BackgroundResponse::status() const {
  std::lock_guard lock(mutex_);
  return response_.value("status", "");
}

bool BackgroundResponse::ended() const {
  std::lock_guard lock(mutex_);
  return ended_;
}

json BackgroundResponse::snapshot() const {
  std::lock_guard lock(mutex_);
  json r = response_;
  r["output"] = output_;
  return r;
}

BackgroundResponse::Events BackgroundResponse::events_after(int64_t after) const {
  std::lock_guard lock(mutex_);
  Events e{"", after, false};
  for (int64_t i = std::max<int64_t>(after + 1, 0); i < int64_t(events_.size()); ++i) {
    e.sse += events_[size_t(i)];
    e.last = i;
  }
  e.end = ended_;
  return e;
}

int BackgroundResponse::watch(std::function<void()> wake) {
  std::lock_guard lock(mutex_);
  watchers_.emplace_back(next_watch_, std::move(wake));
  return next_watch_++;
}

void BackgroundResponse::unwatch(int id) {
  std::lock_guard lock(mutex_);
  std::erase_if(watchers_, [id](const auto& w) { return w.first == id; });
}

size_t BackgroundResponse::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void ResponseStore::put(const std::string& id, StoredResponse response) {
  auto stored = std::make_shared<const StoredResponse>(std::move(response));
  const size_t bytes =
      text_bytes(stored->response) + text_bytes(stored->input_items) + text_bytes(stored->messages);
  std::lock_guard lock(mutex_);
  if (bytes > max_bytes_) return;  // larger than the whole store: never kept
  Entry entry{id, std::move(stored), nullptr, bytes};
  if (auto old = by_id_.find(id); old != by_id_.end()) entry.background = old->second->background;
  insert(std::move(entry));
}

void ResponseStore::start_background(const std::string& id, std::shared_ptr<BackgroundResponse> background) {
  std::lock_guard lock(mutex_);
  if (running_locked() >= max_running_) {
    ApiError e(429,
               fmt::format("{} background responses are running, the most this server runs at once; retry "
                           "when one has ended, or cancel one",
                           max_running_),
               "rate_limit_exceeded", "background");
    e.retry_after_s = 1;
    throw e;
  }
  insert({id, nullptr, std::move(background), 0});
}

void ResponseStore::insert(Entry entry) {
  settle();
  // A background response counts its events once it has ended (its record no longer grows).
  if (entry.background) {
    if (entry.background->ended()) {
      entry.bytes += entry.background->bytes();
    } else if (std::find(unsettled_.begin(), unsettled_.end(), entry.id) == unsettled_.end()) {
      unsettled_.push_back(entry.id);
    }
  }
  if (auto old = by_id_.find(entry.id); old != by_id_.end()) {
    bytes_ -= old->second->bytes;
    order_.erase(old->second);
  }
  bytes_ += entry.bytes;
  order_.push_back(std::move(entry));
  by_id_[order_.back().id] = std::prev(order_.end());
  // The oldest first, skipping the running, which do not count against max_entries (there are at most
  // max_running of them).
  auto over = [&] { return order_.size() - unsettled_.size() > max_entries_ || bytes_ > max_bytes_; };
  for (auto it = order_.begin(); it != order_.end() && over();) {
    if (it->background && !it->background->ended()) {
      ++it;
      continue;
    }
    bytes_ -= it->bytes;
    by_id_.erase(it->id);
    it = order_.erase(it);
  }
}

void ResponseStore::settle() {
  std::erase_if(unsettled_, [&](const std::string& id) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return true;
    Entry& e = *it->second;
    if (!e.background->ended()) return false;
    e.bytes += e.background->bytes();
    bytes_ += e.background->bytes();
    return true;
  });
}

size_t ResponseStore::running_locked() {
  settle();
  return unsettled_.size();
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second->response;
}

std::shared_ptr<BackgroundResponse> ResponseStore::background(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second->background;
}

bool ResponseStore::erase(const std::string& id) {
  std::shared_ptr<BackgroundResponse> background;
  {
    std::lock_guard lock(mutex_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    background = it->second->background;
    bytes_ -= it->second->bytes;
    order_.erase(it->second);
    by_id_.erase(it);
  }
  if (background) background->cancel();  // a deleted response stops running
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

size_t ResponseStore::running() {
  std::lock_guard lock(mutex_);
  return running_locked();
}

namespace {

// The decoded value of the query parameter `name` (form encoding: %XX and '+'), nullopt when absent.
std::optional<std::string> query_param(std::string_view query, std::string_view name) {
  auto decode = [](std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      unsigned value = 0;
      if (s[i] == '%' && i + 2 < s.size() &&
          std::from_chars(s.data() + i + 1, s.data() + i + 3, value, 16).ptr == s.data() + i + 3) {
        out += char(value);
        i += 2;
      } else {
        out += s[i] == '+' ? ' ' : s[i];
      }
    }
    return out;
  };
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (decode(pair.substr(0, eq)) != name) continue;
    return eq == std::string_view::npos ? std::string() : decode(pair.substr(eq + 1));
  }
  return std::nullopt;
}

// A string as a JSON literal, for messages (invalid UTF-8 replaced, never thrown on).
std::string json_literal(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

HttpResponse json_response(const json& j) {
  HttpResponse r;
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

void require_method(const HttpRequest& request, const char* method) {
  if (request.method != method) {
    throw ApiError(405, fmt::format("{} {} is not allowed; use {}", request.method, request.path, method),
                   "method_not_allowed");
  }
}

// The page of `items` (oldest first) a list request asks for, as OpenAI's cursor pages: `order` desc (the
// default) lists the newest first, `after`/`before` are the id of an item the page starts after or ends
// before in that order.
json input_items_page(const json& items, std::string_view query) {
  int limit = 20;
  if (auto v = query_param(query, "limit")) {
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), limit);
    if (ec != std::errc() || end != v->data() + v->size() || limit < 1 || limit > 100)
      throw invalid_param("limit", "must be an integer from 1 to 100, got '{}'", *v);
  }
  const std::string order = query_param(query, "order").value_or("desc");
  if (order != "asc" && order != "desc") throw invalid_param("order", "must be asc or desc, got '{}'", order);
  std::vector<const json*> listed;
  for (const json& item : items) listed.push_back(&item);
  if (order == "desc") std::reverse(listed.begin(), listed.end());
  auto position = [&](const char* param) -> std::optional<size_t> {
    auto id = query_param(query, param);
    if (!id) return std::nullopt;
    auto it = std::find_if(listed.begin(), listed.end(),
                           [&](const json* item) { return item->value("id", "") == *id; });
    if (it == listed.end())
      throw invalid_param(param, "no input item {} in this response", json_literal(*id));
    return size_t(it - listed.begin());
  };
  size_t from = 0, to = listed.size();
  if (auto after = position("after")) from = *after + 1;
  if (auto before = position("before")) to = std::min(to, *before);
  json data = json::array();
  for (size_t i = from; i < to && data.size() < size_t(limit); ++i) data.push_back(*listed[i]);
  const bool has_more = from + data.size() < to;
  json first = data.empty() ? json(nullptr) : data.front()["id"];
  json last = data.empty() ? json(nullptr) : data.back()["id"];
  return {{"object", "list"},
          {"data", std::move(data)},
          {"first_id", std::move(first)},
          {"last_id", std::move(last)},
          {"has_more", has_more}};
}

}  // namespace

namespace {

// A background response's events as an SSE body, from after `after`, live until the response ends.
class EventStream : public AsyncBody {
 public:
  EventStream(std::shared_ptr<BackgroundResponse> background, int64_t after)
      : background_(std::move(background)), last_(after) {}
  ~EventStream() override { stop_watching(); }

  void start(std::function<void()> wake) override {
    watch_ = background_->watch(wake);
    wake();
  }
  Step poll(Clock::time_point) override {
    Step step;
    if (!head_sent_) {
      step.head =
          Head{200, "text/event-stream", {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}}, true};
      head_sent_ = true;
    }
    auto events = background_->events_after(last_);
    step.data = std::move(events.sse);
    last_ = events.last;
    step.done = events.end;
    if (step.done) stop_watching();
    return step;
  }
  void cancel() override { stop_watching(); }  // the client left; the response runs on

 private:
  void stop_watching() {
    if (watch_) background_->unwatch(*watch_);
    watch_.reset();
  }
  std::shared_ptr<BackgroundResponse> background_;
  int64_t last_;
  std::optional<int> watch_;
  bool head_sent_ = false;
};

}  // namespace

std::shared_ptr<AsyncBody> background_event_stream(std::shared_ptr<BackgroundResponse> background,
                                                   int64_t after) {
  return std::make_shared<EventStream>(std::move(background), after);
}

Reply stored_response_request(ResponseStore& store, const HttpRequest& request, std::string_view rest) {
  const size_t slash = rest.find('/');
  const std::string id(rest.substr(0, slash));
  const std::string_view action =
      slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  if (id.empty() || (!action.empty() && action != "input_items" && action != "cancel"))
    throw ApiError(404, fmt::format("no route for {} {}", request.method, request.path), "not_found_error");
  // Checked before the id, so a wrong method is a 405 whatever the id.
  if (action == "input_items") require_method(request, "GET");
  if (action == "cancel") require_method(request, "POST");
  if (action.empty() && request.method != "DELETE") require_method(request, "GET");

  auto unknown = [&] {
    return ApiError(
        404,
        fmt::format("no response {} in this server's memory (it keeps the latest stored responses "
                    "only, none created with store: false, and none across restarts)",
                    json_literal(id)),
        "invalid_request_error", "response_id");
  };
  Reply reply;
  if (request.method == "DELETE") {
    if (!store.erase(id)) throw unknown();
    reply.response = json_response({{"id", id}, {"object", "response"}, {"deleted", true}});
    return reply;
  }
  auto stored = store.get(id);
  auto background = store.background(id);
  if (!stored && !background) throw unknown();
  if (action == "cancel") {
    if (!background) {
      throw ApiError(400, "only responses created with background: true can be cancelled",
                     "invalid_request_error", "response_id");
    }
    // A second cancel answers as the first did (OpenAI's cancel is idempotent).
    if (background->status() != "cancelled" && !background->cancel()) {
      throw ApiError(400,
                     fmt::format("the response {} has already ended ({}); only a queued or in-progress "
                                 "response can be cancelled",
                                 json_literal(id), background->status()),
                     "invalid_request_error", "response_id");
    }
    reply.response = json_response(background->snapshot());
    return reply;
  }
  if (action == "input_items") {
    reply.response = json_response(
        input_items_page(stored ? stored->input_items : background->input_items(), request.query));
    return reply;
  }
  if (auto stream = query_param(request.query, "stream"); stream && *stream != "false") {
    if (!background) {
      throw invalid_param("stream",
                          "only a response created with background: true can be streamed again; this one "
                          "ran in the foreground");
    }
    int64_t after = -1;
    if (auto v = query_param(request.query, "starting_after")) {
      auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), after);
      if (ec != std::errc() || end != v->data() + v->size() || after < 0)
        throw invalid_param("starting_after", "must be a non-negative integer (a sequence_number), got '{}'",
                            *v);
    }
    reply.body = background_event_stream(background, after);
    return reply;
  }
  reply.response = json_response(background ? background->snapshot() : stored->response);
  return reply;
}

}  // namespace moeserve::server
