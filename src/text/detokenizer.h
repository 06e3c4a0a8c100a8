#pragma once
// Streaming output: turning generated ids into text deltas, and cutting the text at stop strings.
//
// IncrementalDetokenizer holds back the bytes of a character whose token pieces have not all arrived, so a
// delta is always valid UTF-8, and the concatenation of all deltas (including finish()) equals
// Tokenizer::decode of all ids. Special tokens arrive whole (they are single tokens) or not at all.
//
// StopStringFilter holds back text that might be the start of a stop string, and when one completes, ends
// the stream with the text before it: the stop text itself is never emitted (OpenAI / vLLM semantics).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace moeserve::text {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  // Adds one generated token and returns the text it completes (often the whole token, sometimes "" while a
  // multi-byte character is incomplete, sometimes more than the token when it completes earlier bytes).
  std::string push(int32_t id);
  // End of stream: bytes of a character that never completed come out as U+FFFD, as in a full decode.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // an incomplete UTF-8 sequence, at most 3 bytes
};

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);

  // Adds a text delta; returns what can be emitted now. Once a stop string has completed, returns the text
  // before it, and every later call returns "".
  std::string push(std::string_view delta);
  // End of stream: releases the held-back text (unless a stop string already ended the stream).
  std::string finish();

  bool stopped() const { return stopped_; }
  // The stop string that ended the stream ("" while not stopped).
  const std::string& matched() const { return matched_; }

 private:
  struct Stop {
    std::string text;
    // failure[i]: the length of the longest proper prefix of text[0, i] that is also its suffix (KMP). With it
    // one pass over the held text finds the first occurrence and the longest suffix that starts the stop, in
    // time linear in the held text: a request's stop strings cannot make a step quadratic in their length.
    std::vector<uint32_t> failure;
  };
  std::vector<Stop> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace moeserve::text
