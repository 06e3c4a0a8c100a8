#pragma once
// The reference deployment's four workloads as dialogues of OpenAI chat requests:
//   single_turn  one question of input_len tokens, output_len tokens back
//   multi_turn   `turns` turns; each prompt is the whole conversation so far plus a new user message
//   tool_call    a question sent with `tools`; the tool call that comes back (or a stand-in when the model
//                answered without one) is answered with a tool result, and the model writes the final answer
//   long_gen     one question, long_output_len tokens back
//   image        one question of input_len tokens after images_per_request pictures (data: URLs in image_url
//                parts, each new to the server), output_len tokens back; not part of "all" (a text-only
//                server refuses it)
// A Conversation yields one request at a time and learns the reply before it writes the next one.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen/chat_stream.h"
#include "loadgen/image.h"
#include "loadgen/prompt.h"

namespace moeserve::loadgen {

enum class Scenario { single_turn, multi_turn, tool_call, long_gen, image };

std::string_view scenario_name(Scenario s);
Scenario parse_scenario(std::string_view name);  // throws moeserve::Error naming the valid ones
std::vector<Scenario> all_scenarios();           // the four text ones ("all")

struct WorkloadOptions {
  Scenario scenario = Scenario::single_turn;
  std::string model;
  size_t input_len = 256;
  size_t output_len = 128;
  size_t long_output_len = 4096;
  size_t turns = 10;
  bool ignore_eos = true;  // ask for exact output lengths (ignore_eos + min_tokens)
  double temperature = 0;
  std::string tool_choice = "auto";
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  // Runs with different prompt sets share no prompt (a sweep's second run must not hit the prefix cache
  // the first one filled); the scenario is mixed in too.
  size_t prompt_set = 0;
  // The image scenario: pictures per request, their size and encoding, and the run's pictures (picture
  // i of dialogue d is images->url(d * images_per_request + i); null: drawn when the request is written).
  size_t images_per_request = 1;
  ImageShape image;
  const ImageSet* images = nullptr;
};

// Requests one dialogue of this scenario sends when every turn succeeds.
size_t requests_per_conversation(const WorkloadOptions& options);

struct TurnRequest {
  std::string body;  // the JSON request body
  size_t turn = 0;
  size_t expected_input_tokens = 0;
  size_t expected_output_tokens = 0;
  bool exact_output = false;  // ignore_eos + min_tokens were sent
  size_t images = 0;          // pictures in the request
};

class Conversation {
 public:
  // `prompts` must outlive the conversation.
  Conversation(WorkloadOptions options, const PromptGenerator& prompts, size_t index);

  bool done() const { return turn_ >= turns_; }
  TurnRequest next();                 // the next turn's request; requires !done()
  void complete(const Reply& reply);  // that turn succeeded: carry its reply forward
  void abandon() { turn_ = turns_; }  // that turn failed: the dialogue ends here

  const nlohmann::json& messages() const { return messages_; }
  // tool_call only: whether the server returned a real tool call (false: the bench stood one in).
  bool tool_call_returned() const { return tool_call_returned_; }

 private:
  nlohmann::json body(size_t max_tokens, bool exact_length) const;

  WorkloadOptions options_;
  const PromptGenerator& prompts_;
  size_t index_;
  size_t turn_ = 0;
  size_t turns_;
  nlohmann::json messages_ = nlohmann::json::array();
  bool tool_call_returned_ = false;
};

}  // namespace moeserve::loadgen
