#pragma once
// The fuzz targets: each takes arbitrary bytes, drives one parser of untrusted input and checks what it
// promises (a clean, short error or a well-formed result). The same functions run under libFuzzer
// (libfuzzer_main.cpp, built by scripts/fuzz.sh in build-fuzz/) and in the normal test suite, which replays
// tests/fuzz/corpus/<target>/ and the generated attack inputs (corpus_replay_test.cpp).
//
// A broken promise throws FuzzFinding. Nothing catches it: under libFuzzer the uncaught exception aborts at
// the throw with the stack intact (a crash with a reproducer), in the replay test gtest names the input.

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moeserve::fuzz {

class FuzzFinding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

#define FUZZ_CHECK(condition, ...) \
  ((condition) ? void(0) : throw ::moeserve::fuzz::FuzzFinding(fmt::format(__VA_ARGS__)))

// What became of an input: the replay test checks that a corpus exercises both.
enum class Verdict { kAccepted, kRefused };

// Errors a peer can provoke go back to it (or to a log): they name the problem without quoting a huge value.
constexpr size_t kMaxErrorMessage = 1024;

inline void check_error_message(std::string_view what) {
  FUZZ_CHECK(!what.empty(), "an error without a message");
  FUZZ_CHECK(what.size() <= kMaxErrorMessage, "an error message of {} bytes (at most {}): {}...", what.size(),
             kMaxErrorMessage, what.substr(0, 200));
}

// Strict UTF-8 (RFC 3629: shortest form, no surrogates, at most U+10FFFF), written here rather than taken
// from src/text so that the tokenizer is not checked against itself.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 4;
    if (n == 4 || i + n >= s.size()) return false;  // a bad lead byte, or the sequence is cut short
    uint32_t cp = n == 0 ? c : n == 1 ? c & 0x1F : n == 2 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = cp << 6 | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// The targets. Each name is also the folder of its corpus and the stem of its dictionary (tests/fuzz/*.dict).
Verdict fuzz_safetensors(std::string_view data);     // the safetensors header of a checkpoint
Verdict fuzz_bounded_json(std::string_view data);    // parse_bounded_json against nlohmann's parser
Verdict fuzz_openai_request(std::string_view data);  // /v1/chat/completions and /v1/completions bodies
Verdict fuzz_json_schema(std::string_view data);     // schema JSON, NUL, then bytes fed to its matcher
Verdict fuzz_router_request(std::string_view data);  // flags byte, then a body the router inspects
Verdict fuzz_tokenizer(std::string_view data);       // flags byte, then text to encode or ids to decode
Verdict fuzz_model_config(std::string_view data);    // a checkpoint's config.json
Verdict fuzz_output_parser(std::string_view data);   // flags, cut, then model output (reasoning, tool calls)

}  // namespace moeserve::fuzz
