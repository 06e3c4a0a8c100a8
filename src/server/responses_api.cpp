#include "server/responses_api.h"

#include <fmt/format.h>

#include "server/job_spec.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

// The Responses API's response object of `spec`, its request's fields echoed.
json responses_object(const JobSpec& spec, const std::string& model, const std::string& status, json output,
                      json usage) {
  json r = {
      {"id", spec.id},
      {"object", "response"},
      {"created_at", spec.created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
      {"model", model},
      {"output", std::move(output)}};
  for (auto& [k, v] : spec.responses->echo.items()) r[k] = v;
  r["usage"] = std::move(usage);
  return r;
}

json responses_usage(const JobSpec& spec, const std::vector<ChoiceOutput>& choices) {
  json u = usage_json(spec, choices);
  return {{"input_tokens", u["prompt_tokens"]},
          {"input_tokens_details", {{"cached_tokens", u["prompt_tokens_details"]["cached_tokens"]}}},
          {"output_tokens", u["completion_tokens"]},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u["total_tokens"]}};
}

}  // namespace

json queued_response(const JobSpec& spec, const std::string& model) {
  return responses_object(spec, model, "queued", json::array(), nullptr);
}

namespace {

// Writes a response as the Responses API's objects: output items and, streamed, typed events (each an SSE
// event named by its type, numbered by sequence_number).
class ResponsesEncoder : public ResponseEncoder {
 public:
  // A background response's record already holds its first events (created, queued): numbering goes on.
  explicit ResponsesEncoder(const EncoderContext& ctx)
      : ctx_(ctx),
        request_(*ctx.spec.responses),
        sequence_(ctx.spec.background ? ctx.spec.background->next_sequence() : 0) {}

  std::string delta(const ChoiceOutput& c, const ChoiceDelta& d) override {
    std::string out;
    if (!started_) {
      started_ = true;
      if (!ctx_.spec.background)
        out +=
            event("response.created", {{"response", response_object("in_progress", json::array(), false)}});
      out +=
          event("response.in_progress", {{"response", response_object("in_progress", json::array(), false)}});
    }
    if (!d.text.reasoning_content.empty()) out += text_delta(Open::kReasoning, d.text.reasoning_content);
    if (!d.text.content.empty())
      out += text_delta(Open::kMessage, d.text.content, logprobs(c, d.content_tokens));
    for (const auto& t : d.text.tool_calls) {
      if (!t.id.empty()) {
        out += close();
        open_ = Open::kCall;
        item_ = {{"id", item_id("fc")}, {"type", "function_call"}, {"status", "in_progress"},
                 {"arguments", ""},     {"call_id", t.id},         {"name", t.name}};
        out += event("response.output_item.added", {{"output_index", items_.size()}, {"item", item_}});
      }
      if (open_ != Open::kCall || t.arguments.empty()) continue;
      item_["arguments"] = item_["arguments"].get<std::string>() + t.arguments;
      out += event("response.function_call_arguments.delta",
                   {{"item_id", item_["id"]}, {"output_index", items_.size()}, {"delta", t.arguments}});
    }
    if (d.finished) {
      out += close();
      finish_reason_ = c.finish_reason();
    }
    return out;
  }

  std::string stream_end(const std::string& error) override {
    std::string out = close();
    if (!error.empty()) {
      json failed = response_object("failed", items_, true);
      failed["error"] = {{"code", "server_error"}, {"message", error}};
      return out + event("response.failed", {{"response", failed}});
    }
    json done = response_object(status(), items_, true);
    remember(ctx_.choices.at(0), done);
    return out + event(done["status"] == "completed" ? "response.completed" : "response.incomplete",
                       {{"response", done}});
  }

  std::string whole() override {
    const ChoiceOutput& c = ctx_.choices.at(0);
    finish_reason_ = c.finish_reason();
    const auto& m = c.message();
    json items = json::array();
    if (!m.reasoning_content.empty()) {
      items.push_back({{"id", item_id("rs")},
                       {"type", "reasoning"},
                       {"summary", json::array()},
                       {"content", {{{"type", "reasoning_text"}, {"text", m.reasoning_content}}}},
                       {"status", "completed"}});
    }
    if (!m.content.empty()) {
      items.push_back({{"id", item_id("msg")},
                       {"type", "message"},
                       {"status", "completed"},
                       {"role", "assistant"},
                       {"content", {output_text(m.content, logprobs(c, c.content_tokens()))}}});
    }
    for (const auto& call : m.tool_calls) {
      items.push_back({{"id", item_id("fc")},
                       {"type", "function_call"},
                       {"status", "completed"},
                       {"arguments", call.arguments},
                       {"call_id", call.id},
                       {"name", call.name}});
    }
    json response = response_object(status(), items, true);
    remember(c, response);
    return response.dump(-1, ' ', false, json::error_handler_t::replace);
  }

 private:
  enum class Open { kNone, kReasoning, kMessage, kCall };

  static json output_text(const std::string& text, json logprobs = json::array()) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", logprobs}};
  }
  // The logprobs of the answer's tokens in `spans` (empty unless the request included them).
  json logprobs(const ChoiceOutput& c, const std::vector<std::pair<size_t, size_t>>& spans) const {
    json out = json::array();
    if (!ctx_.spec.logprobs) return out;
    for (auto [from, to] : spans)
      for (auto& e : token_logprobs(ctx_.tokenizer, c.logprobs(), from, to)) out.push_back(std::move(e));
    return out;
  }
  std::string item_id(const char* kind) {
    return fmt::format("{}_{}{}", kind, ctx_.spec.id.substr(5), next_item_++);
  }

  std::string status() const { return finish_reason_ == "length" ? "incomplete" : "completed"; }

  json response_object(const std::string& status, json output, bool usage) const {
    return responses_object(ctx_.spec, ctx_.model, status, std::move(output),
                            usage ? responses_usage(ctx_.spec, ctx_.choices) : json(nullptr));
  }

  std::string event(const char* type, json data) {
    json e = {{"type", type}, {"sequence_number", sequence_++}};
    for (auto& [k, v] : data.items()) e[k] = std::move(v);
    if (ctx_.spec.background) ctx_.spec.background->publish(e);
    return fmt::format("event: {}\ndata: {}\n\n", type,
                       e.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  // Reasoning or message text: continues the open item of that kind, or closes the open one and starts it.
  std::string text_delta(Open kind, const std::string& text, json logprobs = json::array()) {
    std::string out;
    const bool reasoning = kind == Open::kReasoning;
    const char* part_type = reasoning ? "reasoning_text" : "output_text";
    if (open_ != kind) {
      out += close();
      open_ = kind;
      text_.clear();
      text_logprobs_ = json::array();
      item_ = reasoning ? json{{"id", item_id("rs")},
                               {"type", "reasoning"},
                               {"summary", json::array()},
                               {"content", json::array()}}
                        : json{{"id", item_id("msg")},
                               {"type", "message"},
                               {"status", "in_progress"},
                               {"role", "assistant"},
                               {"content", json::array()}};
      out += event("response.output_item.added", {{"output_index", items_.size()}, {"item", item_}});
      json part = reasoning ? json{{"type", part_type}, {"text", ""}} : output_text("");
      out += event(
          "response.content_part.added",
          {{"item_id", item_["id"]}, {"output_index", items_.size()}, {"content_index", 0}, {"part", part}});
    }
    text_ += text;
    json e = {
        {"item_id", item_["id"]}, {"output_index", items_.size()}, {"content_index", 0}, {"delta", text}};
    if (!reasoning) {
      for (const json& entry : logprobs) text_logprobs_.push_back(entry);
      e["logprobs"] = std::move(logprobs);
    }
    out += event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", std::move(e));
    return out;
  }

  // Ends the open item: its done events, and it joins the output.
  std::string close() {
    std::string out;
    const json index = items_.size();
    if (open_ == Open::kReasoning || open_ == Open::kMessage) {
      const bool reasoning = open_ == Open::kReasoning;
      json part =
          reasoning ? json{{"type", "reasoning_text"}, {"text", text_}} : output_text(text_, text_logprobs_);
      out +=
          event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
      out += event("response.content_part.done",
                   {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
      item_["content"] = json::array({part});
    } else if (open_ == Open::kCall) {
      out += event("response.function_call_arguments.done",
                   {{"item_id", item_["id"]}, {"output_index", index}, {"arguments", item_["arguments"]}});
    } else {
      return out;
    }
    item_["status"] = "completed";
    out += event("response.output_item.done", {{"output_index", index}, {"item", item_}});
    items_.push_back(std::move(item_));
    item_ = json();
    open_ = Open::kNone;
    return out;
  }

  // The response as the client received it, the items that produced it (named here where the client gave no
  // id) and the conversation with this answer, for GET /v1/responses/{id}, its input_items and a later
  // previous_response_id.
  void remember(const ChoiceOutput& c, const json& response) {
    if (!request_.store || !ctx_.spec.response_store) return;
    StoredResponse stored;
    stored.response = response;
    stored.input_items = stored_input_items(request_, ctx_.spec.id);
    const auto& m = c.message();
    json assistant = {{"role", "assistant"}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& call : m.tool_calls) {
        calls.push_back({{"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      }
      assistant["tool_calls"] = std::move(calls);
    }
    stored.messages = request_.conversation;
    stored.messages.push_back(std::move(assistant));
    ctx_.spec.response_store->put(ctx_.spec.id, std::move(stored));
  }

  EncoderContext ctx_;
  const ResponsesRequest& request_;
  int64_t sequence_;
  bool started_ = false;
  Open open_ = Open::kNone;
  json item_;                           // the open item
  std::string text_;                    // the open reasoning or message item's text
  json text_logprobs_ = json::array();  // the open message's logprobs (when included)
  json items_ = json::array();
  int next_item_ = 0;
  std::string finish_reason_;
};

}  // namespace

std::unique_ptr<ResponseEncoder> make_responses_encoder(const EncoderContext& ctx) {
  return std::make_unique<ResponsesEncoder>(ctx);
}

}  // namespace moeserve::server
