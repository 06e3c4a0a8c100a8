#include "loadgen/chat_stream.h"

#include <nlohmann/json.hpp>

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

std::string string_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

size_t count_or_zero(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<size_t>() : 0;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

void ChatStream::set_error(std::string cause, std::string message) {
  if (!error_cause_.empty()) return;  // the first error explains the rest
  error_cause_ = std::move(cause);
  error_message_ = std::move(message);
}

void ChatStream::on_event(std::string_view data, Clock::time_point at) {
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  json object = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    set_error("bad_response", "a streamed chunk is not a JSON object: " + std::string(data.substr(0, 200)));
    return;
  }
  on_object(object, at, true);
}

void ChatStream::on_full_response(std::string_view body, Clock::time_point at) {
  json object = json::parse(body, nullptr, false);
  if (!object.is_object()) {
    set_error("bad_response", "the response is neither an event stream nor a JSON object: " +
                                  std::string(body.substr(0, 200)));
    return;
  }
  on_object(object, at, false);
  done_ = true;
}

void ChatStream::on_object(const json& chunk, Clock::time_point at, bool streamed) {
  if (chunk.contains("error") || string_or_empty(chunk, "object") == "error") {
    const json& e = chunk.contains("error") ? chunk["error"] : chunk;
    set_error("stream_error", e.is_object() ? string_or_empty(e, "message") : e.dump());
    return;
  }
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    usage_ = true;
    prompt_tokens_ = count_or_zero(*usage, "prompt_tokens");
    completion_tokens_ = count_or_zero(*usage, "completion_tokens");
    if (auto details = usage->find("prompt_tokens_details"); details != usage->end() && details->is_object())
      cached_tokens_ = count_or_zero(*details, "cached_tokens");
  }
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return;
  const json& choice = (*choices)[0];
  if (std::string reason = string_or_empty(choice, "finish_reason"); !reason.empty()) finish_reason_ = reason;
  auto delta = choice.find(streamed ? "delta" : "message");
  if (delta == choice.end() || !delta->is_object()) return;

  bool carries_text = false;
  std::string content = string_or_empty(*delta, "content");
  std::string reasoning = string_or_empty(*delta, "reasoning_content");
  if (reasoning.empty()) reasoning = string_or_empty(*delta, "reasoning");
  carries_text = !content.empty() || !reasoning.empty();
  reply_.content += content;
  reply_.reasoning += reasoning;
  if (auto calls = delta->find("tool_calls"); calls != delta->end() && calls->is_array()) {
    for (const json& call : *calls) {
      // Streamed fragments name their call by index; a whole response lists the calls in order.
      size_t index = streamed ? call.value("index", size_t{0}) : reply_.tool_calls.size();
      if (reply_.tool_calls.size() <= index) reply_.tool_calls.resize(index + 1);
      ToolCall& tc = reply_.tool_calls[index];
      tc.id += string_or_empty(call, "id");
      if (auto fn = call.find("function"); fn != call.end() && fn->is_object()) {
        tc.name += string_or_empty(*fn, "name");
        tc.arguments += string_or_empty(*fn, "arguments");
      }
      carries_text = true;
    }
  }
  if (carries_text) token_times_.push_back(at);
}

void ChatStream::fill(RequestRecord& r, Clock::time_point end) const {
  r.e2e_s = seconds(end - sent_);
  r.chunks = token_times_.size();
  if (!token_times_.empty()) r.ttft_s = seconds(token_times_.front() - sent_);
  r.itl_s.clear();
  for (size_t i = 1; i < token_times_.size(); ++i)
    r.itl_s.push_back(seconds(token_times_[i] - token_times_[i - 1]));
  r.usage_reported = usage_;
  r.prompt_tokens = prompt_tokens_;
  r.completion_tokens = usage_ ? completion_tokens_ : token_times_.size();
  r.cached_tokens = cached_tokens_;
  r.tool_calls = reply_.tool_calls.size();
  r.finish_reason = finish_reason_;
}

}  // namespace moeserve::loadgen
