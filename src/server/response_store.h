#pragma once
// The Responses API's stored responses: what POST /v1/responses keeps (unless `store: false`), and the
// endpoints over it (GET and DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel). The store is
// this server's memory, bounded, and a continuation (previous_response_id) reads it too.

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/http.h"

namespace moeserve::server {

// One stored response.
struct StoredResponse {
  nlohmann::ordered_json response;  // the response object as the client received it
  nlohmann::ordered_json
      input_items;  // the items used to generate it (earlier turns' too), oldest first, ids set
  nlohmann::ordered_json messages;  // the conversation up to and including its answer, in chat form
};

// Responses by id: at most max_entries and max_bytes of their JSON text, the oldest dropped first. vLLM keeps
// every stored response until restart (unbounded); a bound keeps a long-running node's memory flat, and a
// dropped id is a 404 the client can act on.
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 4096, size_t max_bytes = size_t{256} << 20)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}
  void put(const std::string& id, StoredResponse response);
  std::shared_ptr<const StoredResponse> get(const std::string& id) const;
  // false when the store does not hold `id`.
  bool erase(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const StoredResponse> response;
    size_t bytes;
  };
  size_t max_entries_, max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
};

// The request to /v1/responses/{id}[/input_items|/cancel]: `rest` is the path after "/v1/responses/".
// Answers from the store, as OpenAI does: the response object, the deletion object, the input items as a
// list page (`limit` 1-100, `order` asc/desc, `after`/`before` an item id), or for a cancel a 400 (only
// background responses can be cancelled, and this server runs none). Throws ApiError: 404 for an id the store
// does not hold, 405 for a wrong method, 400 for a bad query parameter.
HttpResponse stored_response_request(ResponseStore& store, const HttpRequest& request, std::string_view rest);

}  // namespace moeserve::server
