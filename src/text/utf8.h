#pragma once
// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the template engine.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::text {

// Length of the well-formed UTF-8 sequence at s[i], or 0 if the bytes there are not one (overlong forms,
// surrogates and code points above U+10FFFF count as ill-formed, as in Unicode's definition).
size_t utf8_sequence_length(std::string_view s, size_t i);

bool is_valid_utf8(std::string_view s);

// Replaces each maximal ill-formed subsequence with U+FFFD (the Unicode "best practice", which is what
// Rust's String::from_utf8_lossy and Python's errors="replace" do).
std::string utf8_lossy(std::string_view s);

// Number of bytes at the end of s that form an incomplete but so far well-formed sequence: they may still
// become a character when more bytes arrive. 0 when s ends on a character boundary or on garbage.
size_t utf8_incomplete_tail(std::string_view s);

// Decodes the code point at s[i] (which must start a well-formed sequence) and advances i.
uint32_t utf8_decode(std::string_view s, size_t& i);
void utf8_append(std::string& out, uint32_t code_point);

}  // namespace moeserve::text
