#pragma once
// The OpenAI Responses API's request body (/v1/responses): its input items become chat messages (validated by
// parse_chat_request, so every rule has one message), beside what the answer echoes and what the store keeps.
// previous_response_id reads the conversation from the store. Kept apart from the encoder
// (responses_api.h) so that the fuzz target reaches it alone.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/openai_request.h"
#include "server/response_store.h"

namespace moeserve::server {

// What a Responses request adds to its chat form: the fields echoed in the response object and what the
// store needs once the answer is known.
struct ResponsesRequest {
  ChatRequest chat;
  nlohmann::ordered_json echo;  // instructions, tools, tool_choice, sampling, metadata, ... as the API echoes
  nlohmann::ordered_json conversation;  // the chat messages of this turn (previous turns included)
  // The items of this turn (previous turns' input and output included), oldest first; this request's own
  // items have no "id" unless the client gave one (the stored response names them).
  nlohmann::ordered_json input_items;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool background = false;  // run without the connection (server/background_runner.h)
};

// Throws ApiError 400 naming the field (and 404 for an unknown previous_response_id).
ResponsesRequest parse_responses_request(std::string_view body, const ResponseStore& store);

// The request's input items as the store lists them: each named (kind_<id>in<i>) where the client gave no id.
nlohmann::ordered_json stored_input_items(const ResponsesRequest& request, const std::string& response_id);

}  // namespace moeserve::server
