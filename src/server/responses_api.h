#pragma once
// The OpenAI Responses API (/v1/responses) over the chat pipeline: a request's input items become chat
// messages (validated by parse_chat_request, so every rule has one message), the answer comes back as output
// items (reasoning, message, function_call), whole or as the API's typed stream events. previous_response_id
// continues a conversation kept in this server's memory by ResponseStore (server/response_store.h), which is
// bounded.

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/encoders.h"
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

// A background job's response object as created (status "queued", no output yet).
nlohmann::ordered_json queued_response(const JobSpec& spec, const std::string& model);
// The request's input items as the store lists them: each named (kind_<id>in<i>) where the client gave no id.
nlohmann::ordered_json stored_input_items(const ResponsesRequest& request, const std::string& response_id);

// The encoder of kResponses jobs; the spec's `responses` carries the request and the store.
std::unique_ptr<ResponseEncoder> make_responses_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
