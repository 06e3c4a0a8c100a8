#include "loadgen/sse.h"

namespace moeserve::loadgen {

void SseParser::feed(std::string_view bytes, const Handler& on_event) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the second half of "\r\n"
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\n' || c == '\r') {
      end_line(on_event);
    } else {
      line_ += c;
    }
  }
}

void SseParser::end_line(const Handler& on_event) {
  if (line_.empty()) {
    if (has_data_) on_event(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  std::string_view line = line_;
  if (line.substr(0, 5) == "data:") {
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (has_data_) data_ += '\n';
    data_ += line;
    has_data_ = true;
  }
  line_.clear();
}

}  // namespace moeserve::loadgen
