#include "server/messages_api.h"

#include <fmt/format.h>

#include "common/bounded_json.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// Writes an answer as Anthropic content blocks; streamed, as its events (message_start, content_block_*,
// message_delta, message_stop).
class MessagesEncoder : public ResponseEncoder {
 public:
  explicit MessagesEncoder(const EncoderContext& ctx) : ctx_(ctx) {}

  std::string delta(const ChoiceOutput&, const ChoiceDelta& d) override {
    std::string out;
    if (!started_) {
      started_ = true;
      json message = envelope();
      message["content"] = json::array();
      message["usage"] = {{"input_tokens", input_tokens()}, {"output_tokens", 0}};
      out += event("message_start", {{"message", message}});
    }
    if (!d.text.reasoning_content.empty()) {
      out += block(Open::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += event("content_block_delta",
                   {{"index", index_},
                    {"delta", {{"type", "thinking_delta"}, {"thinking", d.text.reasoning_content}}}});
    }
    if (!d.text.content.empty()) {
      out += block(Open::kText, {{"type", "text"}, {"text", ""}});
      out += event("content_block_delta",
                   {{"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.text.content}}}});
    }
    for (const auto& t : d.text.tool_calls) {
      if (!t.id.empty()) {
        out += close();
        out += block(Open::kToolUse,
                     {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", json::object()}});
      }
      if (open_ == Open::kToolUse && !t.arguments.empty()) {
        out += event(
            "content_block_delta",
            {{"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
      }
    }
    if (d.finished) out += close();
    return out;
  }

  std::string stream_end(const std::string& error) override {
    std::string out = close();
    if (!error.empty()) {
      return out + event("error", {{"error", {{"type", "api_error"}, {"message", error}}}});
    }
    const ChoiceOutput& c = ctx_.choices.at(0);
    out += event("message_delta",
                 {{"delta", {{"stop_reason", stop_reason(c)}, {"stop_sequence", stop_sequence(c)}}},
                  {"usage", {{"output_tokens", c.tokens().size()}}}});
    return out + event("message_stop", json::object());
  }

  std::string whole() override {
    const ChoiceOutput& c = ctx_.choices.at(0);
    const auto& m = c.message();
    json content = json::array();
    if (!m.reasoning_content.empty()) {
      content.push_back({{"type", "thinking"}, {"thinking", m.reasoning_content}, {"signature", ""}});
    }
    if (!m.content.empty()) content.push_back({{"type", "text"}, {"text", m.content}});
    for (const auto& call : m.tool_calls) {
      // The parser always completes a call's arguments as a JSON object; anything else shows as {}.
      json input = parse_bounded_json_or_discarded<json>(call.arguments);
      if (!input.is_object()) input = json::object();
      content.push_back(
          {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}});
    }
    json r = envelope();
    r["content"] = std::move(content);
    r["stop_reason"] = stop_reason(c);
    r["stop_sequence"] = stop_sequence(c);
    json u = usage_json(ctx_.spec, ctx_.choices);
    r["usage"] = {{"input_tokens", u["prompt_tokens"]},
                  {"output_tokens", u["completion_tokens"]},
                  {"cache_read_input_tokens", u["prompt_tokens_details"]["cached_tokens"]}};
    return r.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  enum class Open { kNone, kThinking, kText, kToolUse };

  json envelope() const {
    return {{"id", ctx_.spec.id},  {"type", "message"},      {"role", "assistant"},
            {"model", ctx_.model}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
  }
  int64_t input_tokens() const { return int64_t(ctx_.spec.prompts.at(0).size()); }

  static json stop_reason(const ChoiceOutput& c) {
    const std::string& f = c.finish_reason();
    if (f == "tool_calls") return "tool_use";
    if (f == "length") return "max_tokens";
    if (f == "stop" && c.stop_reason().is_string()) return "stop_sequence";
    return "end_turn";
  }
  static json stop_sequence(const ChoiceOutput& c) {
    return c.stop_reason().is_string() ? c.stop_reason() : json(nullptr);
  }

  std::string event(const char* type, json data) {
    json e = {{"type", type}};
    for (auto& [k, v] : data.items()) e[k] = std::move(v);
    return fmt::format("event: {}\ndata: {}\n\n", type,
                       e.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  // Starts a block of this kind unless one is open (tool_use blocks always start anew).
  std::string block(Open kind, json content_block) {
    if (open_ == kind && kind != Open::kToolUse) return "";
    std::string out = close();
    open_ = kind;
    out += event("content_block_start", {{"index", index_}, {"content_block", std::move(content_block)}});
    return out;
  }

  std::string close() {
    if (open_ == Open::kNone) return "";
    std::string out;
    if (open_ == Open::kThinking) {
      out += event("content_block_delta",
                   {{"index", index_}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
    }
    out += event("content_block_stop", {{"index", index_}});
    ++index_;
    open_ = Open::kNone;
    return out;
  }

  EncoderContext ctx_;
  bool started_ = false;
  Open open_ = Open::kNone;
  int index_ = 0;  // the open block's index, or the next one's
};

}  // namespace

std::unique_ptr<ResponseEncoder> make_messages_encoder(const EncoderContext& ctx) {
  return std::make_unique<MessagesEncoder>(ctx);
}

}  // namespace moeserve::server
