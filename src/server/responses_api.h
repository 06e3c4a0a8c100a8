#pragma once
// The OpenAI Responses API (/v1/responses) over the chat pipeline: a request's input items become chat
// messages (validated by parse_chat_request, so every rule has one message), the answer comes back as output
// items (reasoning, message, function_call), whole or as the API's typed stream events. previous_response_id
// continues a conversation kept in this server's memory by ResponseStore, which is bounded.

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/encoders.h"
#include "server/openai_request.h"

namespace moeserve::server {

// Conversations by response id, for previous_response_id: at most max_entries responses and max_bytes of
// messages (their JSON text), the oldest dropped first. vLLM keeps every stored response until restart
// (unbounded); a bound keeps a long-running node's memory flat, and a dropped id is a 404 the client can act
// on.
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 4096, size_t max_bytes = size_t{256} << 20)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}
  // messages: the whole conversation up to and including the response's assistant turn (chat form).
  void put(const std::string& id, nlohmann::ordered_json messages);
  std::optional<nlohmann::ordered_json> get(const std::string& id) const;
  size_t size() const;

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const nlohmann::ordered_json> messages;
    size_t bytes;
  };
  size_t max_entries_, max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;
};

// What a Responses request adds to its chat form: the fields echoed in the response object and what the
// store needs once the answer is known.
struct ResponsesRequest {
  ChatRequest chat;
  nlohmann::ordered_json echo;  // instructions, tools, tool_choice, sampling, metadata, ... as the API echoes
  nlohmann::ordered_json conversation;  // the chat messages of this turn (previous turns included)
  std::optional<std::string> previous_response_id;
  bool store = true;
};

// Throws ApiError 400 naming the field (and 404 for an unknown previous_response_id).
ResponsesRequest parse_responses_request(std::string_view body, const ResponseStore& store);

// The encoder of kResponses jobs; the spec's `responses` carries the request and the store.
std::unique_ptr<ResponseEncoder> make_responses_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
