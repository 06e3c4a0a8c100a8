// The Qwen3 tokenizer (the real tokenizer.json, .cache/tokenizer-qwen3 from scripts/fetch-test-data.sh) on
// arbitrary bytes. The first byte picks the mode: bit 0 add_special_tokens, bit 1 skip_special_tokens, bit 2
// decode (the rest as little-endian int32 ids) instead of encode (the rest as text).
// Encoding gives ids inside the vocabulary, the same ids twice (the word cache), and text that decodes back:
// to the NFC form of valid UTF-8 input (the tokenizer's normalizer), to valid UTF-8 always. Decoding any ids
// gives valid UTF-8, or a short moeserve::Error for a negative id.
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/error.h"
#include "fuzz_target.h"
#include "text/tokenizer.h"

namespace moeserve::fuzz {

namespace {

const text::Tokenizer& qwen3() {
  static const text::Tokenizer t = text::Tokenizer::from_file(".cache/tokenizer-qwen3/tokenizer.json");
  return t;
}

std::string nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                   utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  FUZZ_CHECK(n >= 0, "utf8proc refused valid UTF-8: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), size_t(n));
}

// False when decode refused the ids (rightly: a negative one).
bool check_decodes(const text::Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  bool negative = false;
  for (int32_t id : ids) negative |= id < 0;
  std::string decoded;
  try {
    decoded = t.decode(ids, skip_special);
  } catch (const Error& e) {
    FUZZ_CHECK(negative, "decode refused non-negative ids: {}", e.what());
    check_error_message(e.what());
    return false;
  }
  FUZZ_CHECK(!negative, "decode accepted a negative id");
  FUZZ_CHECK(is_valid_utf8(decoded), "decode gave ill-formed UTF-8");
  return true;
}

}  // namespace

Verdict fuzz_tokenizer(std::string_view data) {
  if (data.empty()) return Verdict::kRefused;
  const text::Tokenizer& t = qwen3();
  const auto flags = static_cast<unsigned char>(data.front());
  const bool add_special = flags & 1, skip_special = flags & 2;
  data.remove_prefix(1);

  if (flags & 4) {
    std::vector<int32_t> ids(data.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), data.data(), ids.size() * 4);
    for (int32_t id : ids)
      if (id >= 0) (void)t.token_bytes(id);
    return check_decodes(t, ids, skip_special) ? Verdict::kAccepted : Verdict::kRefused;
  }

  const std::vector<int32_t> ids = t.encode(data, add_special);
  for (int32_t id : ids)
    FUZZ_CHECK(id >= 0 && size_t(id) < t.vocab_size(), "encode gave id {} (vocabulary {})", id,
               t.vocab_size());
  FUZZ_CHECK(t.encode(data, add_special) == ids, "a second encode of the same text differs");
  FUZZ_CHECK(check_decodes(t, ids, skip_special), "the ids of an encoding do not decode");
  // Qwen's post-processor adds nothing, and the byte-level BPE loses nothing but what NFC folds.
  if (is_valid_utf8(data))
    FUZZ_CHECK(t.decode(ids) == nfc(data), "decode(encode(text)) is not the NFC form of the text");
  return Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
