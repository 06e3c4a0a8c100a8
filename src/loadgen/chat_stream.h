#pragma once
// Folds the streamed chunks of one /v1/chat/completions response (or one non-streamed response) into the
// assistant's reply and the request's timings. A chunk "carries generated text" when its delta has content,
// reasoning or a tool-call fragment; role-only and usage-only chunks do not count as tokens.

#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/record.h"

namespace moeserve::loadgen {

using Clock = std::chrono::steady_clock;

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

struct Reply {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

class ChatStream {
 public:
  explicit ChatStream(Clock::time_point sent) : sent_(sent) {}

  // One SSE `data` payload that arrived at `at`.
  void on_event(std::string_view data, Clock::time_point at);
  // A whole chat.completion object (a server that ignored "stream": true).
  void on_full_response(std::string_view body, Clock::time_point at);

  bool done() const { return done_; }  // "[DONE]" seen
  bool finished() const { return !finish_reason_.empty(); }
  bool failed() const { return !error_cause_.empty(); }
  const std::string& error_cause() const { return error_cause_; }
  const std::string& error_message() const { return error_message_; }
  const Reply& reply() const { return reply_; }

  // Writes timings, token counts and the finish reason into `r`; `end` is when the stream ended.
  void fill(RequestRecord& r, Clock::time_point end) const;

 private:
  void on_object(const nlohmann::json& chunk, Clock::time_point at, bool streamed);
  void set_error(std::string cause, std::string message);

  Clock::time_point sent_;
  std::vector<Clock::time_point> token_times_;
  Reply reply_;
  std::string finish_reason_;
  bool done_ = false;
  bool usage_ = false;
  size_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  std::string error_cause_, error_message_;
};

}  // namespace moeserve::loadgen
