#pragma once
// What the client measured for one HTTP request. Times are seconds; `start_s` counts from the start of the
// run. Token counts come from the server's usage block when it sends one (stream_options.include_usage).

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace moeserve::loadgen {

struct RequestRecord {
  size_t id = 0;            // issue order within the run
  size_t conversation = 0;  // multi-turn and tool-call requests of one dialogue share this
  size_t turn = 0;          // 0-based position in the dialogue
  double start_s = 0;

  bool ok = false;
  std::string error_cause;    // empty when ok; see docs/bench.md for the list
  std::string error_message;  // what the server or the socket said
  int http_status = 0;

  double ttft_s = 0;          // request sent -> first chunk carrying generated text
  double e2e_s = 0;           // request sent -> end of the stream
  std::vector<double> itl_s;  // gaps between successive chunks carrying generated text
  size_t chunks = 0;          // chunks carrying generated text

  size_t expected_input_tokens = 0;   // tokens of the new user message the generator wrote
  size_t expected_output_tokens = 0;  // max_tokens asked for
  bool exact_output = false;          // asked for exactly that many (ignore_eos + min_tokens)
  size_t prompt_tokens = 0;           // usage.prompt_tokens (whole rendered prompt)
  size_t completion_tokens = 0;       // usage.completion_tokens, else the number of chunks
  size_t cached_tokens = 0;           // usage.prompt_tokens_details.cached_tokens
  bool usage_reported = false;
  size_t tool_calls = 0;  // tool calls the server returned
  size_t images = 0;      // pictures the request carried (the image scenario)
  std::string finish_reason;

  // Time per output token after the first: (e2e - ttft) / (completion_tokens - 1); 0 for one token.
  double tpot_s() const;
};

nlohmann::json to_json(const RequestRecord& r);
RequestRecord record_from_json(const nlohmann::json& j);

}  // namespace moeserve::loadgen
