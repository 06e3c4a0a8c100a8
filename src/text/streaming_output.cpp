#include "text/streaming_output.h"

namespace moeserve::text {

void append(OutputDelta& into, OutputDelta more) {
  into.reasoning_content += more.reasoning_content;
  into.content += more.content;
  for (auto& c : more.tool_calls) {
    if (!into.tool_calls.empty() && into.tool_calls.back().index == c.index && c.id.empty()) {
      into.tool_calls.back().arguments += c.arguments;
    } else {
      into.tool_calls.push_back(std::move(c));
    }
  }
}

StreamingOutput::StreamingOutput(const Tokenizer* tokenizer, StreamingOptions options)
    : prefix_(std::move(options.assistant_prefix)), include_stop_(options.include_stop_str_in_output) {
  if (tokenizer) {
    detok_.emplace(*tokenizer, options.skip_special_tokens);
    if (!options.stops.empty()) stop_.emplace(std::move(options.stops));
  }
  if (options.parser) parser_.emplace(*options.parser);
}

const std::string& StreamingOutput::matched_stop() const {
  static const std::string kNone;
  return stop_ ? stop_->matched() : kNone;
}

const ParsedOutput& StreamingOutput::message() const {
  return parser_ ? parser_->result() : unparsed_;
}

OutputDelta StreamingOutput::feed(std::string text) {
  text_ += text;
  if (!prefix_.empty()) {
    text.insert(0, prefix_);
    prefix_.clear();
  }
  if (parser_) return parser_->push(text);
  unparsed_.content += text;
  OutputDelta d;
  d.content = std::move(text);
  return d;
}

OutputDelta StreamingOutput::push(int32_t id) {
  if (finished_ || stopped()) return {};
  std::string text = detok_ ? detok_->push(id) : "";
  if (stop_) {
    text = stop_->push(text);
    if (stop_->stopped() && include_stop_) text += stop_->matched();
  }
  return feed(std::move(text));
}

OutputDelta StreamingOutput::finish() {
  if (finished_) return {};
  finished_ = true;
  std::string tail;
  if (detok_ && !stopped()) {
    tail = detok_->finish();
    if (stop_) {
      tail = stop_->push(tail);
      if (stop_->stopped()) {
        if (include_stop_) tail += stop_->matched();
      } else {
        tail += stop_->finish();
      }
    }
  }
  OutputDelta d = feed(std::move(tail));
  if (parser_) append(d, parser_->finish());
  return d;
}

}  // namespace moeserve::text
