#include "server/response_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <vector>

#include "server/api_error.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

void ResponseStore::put(const std::string& id, StoredResponse response) {
  auto stored = std::make_shared<const StoredResponse>(std::move(response));
  auto text_bytes = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace).size();
  };
  const size_t bytes =
      text_bytes(stored->response) + text_bytes(stored->input_items) + text_bytes(stored->messages);
  std::lock_guard lock(mutex_);
  if (bytes > max_bytes_) return;  // larger than the whole store: never kept
  if (auto old = by_id_.find(id); old != by_id_.end()) {
    bytes_ -= old->second->bytes;
    order_.erase(old->second);
  }
  order_.push_back({id, std::move(stored), bytes});
  by_id_[id] = std::prev(order_.end());
  bytes_ += bytes;
  while (order_.size() > max_entries_ || bytes_ > max_bytes_) {
    bytes_ -= order_.front().bytes;
    by_id_.erase(order_.front().id);
    order_.pop_front();
  }
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second->response;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= it->second->bytes;
  order_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
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

HttpResponse stored_response_request(ResponseStore& store, const HttpRequest& request,
                                     std::string_view rest) {
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
  if (request.method == "DELETE") {
    if (!store.erase(id)) throw unknown();
    return json_response({{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  auto stored = store.get(id);
  if (!stored) throw unknown();
  if (action == "cancel") {
    throw ApiError(400,
                   "only responses created with background: true can be cancelled; this server runs every "
                   "response in the foreground",
                   "invalid_request_error", "response_id");
  }
  if (action == "input_items") return json_response(input_items_page(stored->input_items, request.query));
  if (auto stream = query_param(request.query, "stream"); stream && *stream != "false") {
    throw invalid_param("stream",
                        "streaming a stored response is for background responses, which this "
                        "server does not run");
  }
  return json_response(stored->response);
}

}  // namespace moeserve::server
