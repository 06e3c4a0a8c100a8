#pragma once
// The Anthropic Messages API (/v1/messages) over the chat pipeline; its body is parsed by messages_request.h.
// The answer comes back as content blocks (thinking, text, tool_use), whole or as Anthropic's stream events.

#include <memory>
#include <string_view>

#include "server/encoders.h"

namespace moeserve::server {

// The encoder of kMessages jobs.
std::unique_ptr<ResponseEncoder> make_messages_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
