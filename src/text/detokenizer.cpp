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
  for (auto& text : stops) {
    if (text.empty()) continue;
    Stop stop{std::move(text), {}};
    const std::string& t = stop.text;
    stop.failure.assign(t.size(), 0);
    for (size_t i = 1, k = 0; i < t.size(); ++i) {
      while (k > 0 && t[i] != t[k]) k = stop.failure[k - 1];
      if (t[i] == t[k]) ++k;
      stop.failure[i] = static_cast<uint32_t>(k);
    }
    stops_.push_back(std::move(stop));
  }
}

std::string StopStringFilter::push(std::string_view delta) {
  if (stopped_) return "";
  held_ += delta;
  // The earliest stop occurrence wins; among stops starting at the same place, the longest. Meanwhile, hold
  // back the longest suffix that is a proper prefix of some stop string.
  size_t best = std::string::npos;
  size_t keep = 0;
  for (const Stop& stop : stops_) {
    const std::string& t = stop.text;
    size_t k = 0;  // the stop's prefix matched so far, ending at the current byte
    size_t found = std::string::npos;
    for (size_t i = 0; i < held_.size(); ++i) {
      while (k > 0 && held_[i] != t[k]) k = stop.failure[k - 1];
      if (held_[i] == t[k]) ++k;
      if (k == t.size()) {
        found = i + 1 - t.size();
        break;
      }
    }
    if (found != std::string::npos) {
      if (found < best || (found == best && t.size() > matched_.size())) {
        best = found;
        matched_ = t;
      }
    } else {
      keep = std::max(keep, k);
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
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
