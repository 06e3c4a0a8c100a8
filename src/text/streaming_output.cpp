#include "text/streaming_output.h"

namespace moeserve::text {

StreamingOutput::StreamingOutput(const Tokenizer& tokenizer, std::vector<std::string> stops,
                                 const OutputParserOptions& parser, bool skip_special_tokens)
    : detok_(tokenizer, skip_special_tokens), stop_(std::move(stops)), parser_(parser) {}

OutputDelta StreamingOutput::feed(const std::string& text) {
  text_ += text;
  return parser_.push(text);
}

OutputDelta StreamingOutput::push(int32_t id) {
  if (finished_ || stop_.stopped()) return {};
  return feed(stop_.push(detok_.push(id)));
}

OutputDelta StreamingOutput::finish() {
  if (finished_) return {};
  finished_ = true;
  std::string tail;
  if (!stop_.stopped()) {
    tail = stop_.push(detok_.finish());
    tail += stop_.finish();
  }
  OutputDelta d = feed(tail);
  OutputDelta last = parser_.finish();
  d.reasoning_content += last.reasoning_content;
  d.content += last.content;
  for (auto& c : last.tool_calls) {
    if (!d.tool_calls.empty() && d.tool_calls.back().index == c.index && c.id.empty()) {
      d.tool_calls.back().arguments += c.arguments;
    } else {
      d.tool_calls.push_back(std::move(c));
    }
  }
  return d;
}

}  // namespace moeserve::text
