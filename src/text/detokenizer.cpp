#include "text/detokenizer.h"

#include <algorithm>

#include "text/utf8.h"

namespace moeserve::text {

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return "";
  pending_ += tokenizer_->token_bytes(id);
  size_t tail = utf8_incomplete_tail(pending_);
  std::string_view ready(pending_.data(), pending_.size() - tail);
  std::string out = is_valid_utf8(ready) ? std::string(ready) : utf8_lossy(ready);
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

StopStringFilter::StopStringFilter(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringFilter::push(std::string_view delta) {
  if (stopped_) return "";
  held_ += delta;
  // The earliest stop occurrence wins; among stops starting at the same place, the longest.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > matched_.size()))) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringFilter::finish() {
  if (stopped_) return "";
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace moeserve::text
