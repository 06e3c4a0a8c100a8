#pragma once
// The Anthropic Messages API (/v1/messages) over the chat pipeline: messages with text, tool_use,
// tool_result and thinking blocks become chat messages (validated by parse_chat_request), and the answer
// comes back as content blocks (thinking, text, tool_use), whole or as Anthropic's stream events.

#include <memory>
#include <string_view>

#include "server/encoders.h"
#include "server/openai_request.h"

namespace moeserve::server {

// What a Messages body is for: a message to create, or POST /v1/messages/count_tokens (the same prompt
// fields; max_tokens is not required and sampling is not read).
enum class MessagesBody { kCreate, kCountTokens };

// Throws ApiError 400 naming the field.
ChatRequest parse_messages_request(std::string_view body, MessagesBody use = MessagesBody::kCreate);

// The encoder of kMessages jobs.
std::unique_ptr<ResponseEncoder> make_messages_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
