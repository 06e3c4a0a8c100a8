#pragma once
// The Anthropic Messages API's body (/v1/messages, /v1/messages/count_tokens): messages with text, tool_use,
// tool_result and thinking blocks become chat messages, validated by parse_chat_request (messages_api.h
// writes the answer). Kept apart from the encoder so that the fuzz target reaches it alone.

#include <string_view>

#include "server/openai_request.h"

namespace moeserve::server {

// What a Messages body is for: a message to create, or POST /v1/messages/count_tokens (the same prompt
// fields; max_tokens is not required and sampling is not read).
enum class MessagesBody { kCreate, kCountTokens };

// Throws ApiError 400 naming the field.
ChatRequest parse_messages_request(std::string_view body, MessagesBody use = MessagesBody::kCreate);

}  // namespace moeserve::server
