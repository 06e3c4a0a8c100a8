#pragma once
// Incremental Server-Sent Events parser: bytes in, the `data` of each complete event out. Events end at a
// blank line; several `data:` lines of one event are joined with '\n'; comments (':') and other fields are
// skipped; "\n", "\r\n" and "\r" all end lines. Bytes may arrive split anywhere.

#include <functional>
#include <string>
#include <string_view>

namespace moeserve::loadgen {

class SseParser {
 public:
  using Handler = std::function<void(std::string_view data)>;

  void feed(std::string_view bytes, const Handler& on_event);

  // Bytes of an event that has not ended yet (a stream that stops here was cut short).
  bool pending() const { return !line_.empty() || has_data_; }

 private:
  void end_line(const Handler& on_event);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

}  // namespace moeserve::loadgen
