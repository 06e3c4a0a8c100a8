#pragma once
// The OpenAI Responses API (/v1/responses) over the chat pipeline: the request (server/responses_request.h)
// comes back as output items (reasoning, message, function_call), whole or as the API's typed stream
// events, published to a background response's record when it runs in the background. previous_response_id
// continues a conversation kept in this server's memory by ResponseStore (server/response_store.h), which is
// bounded.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/encoders.h"
#include "server/responses_request.h"

namespace moeserve::server {

// A background job's response object as created (status "queued", no output yet).
nlohmann::ordered_json queued_response(const JobSpec& spec, const std::string& model);
// The encoder of kResponses jobs; the spec's `responses` carries the request and the store.
std::unique_ptr<ResponseEncoder> make_responses_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
