#include "text/utf8.h"

namespace moeserve::text {

namespace {

// Valid range of the second byte given the lead byte (Unicode Table 3-7); later bytes are 80..BF.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

size_t expected_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// How many bytes from s[i] form a well-formed prefix of a sequence (capped at the expected length).
size_t valid_prefix(std::string_view s, size_t i, size_t& need) {
  auto lead = static_cast<unsigned char>(s[i]);
  need = expected_length(lead);
  if (need <= 1) return need;
  size_t k = 1;
  while (k < need && i + k < s.size()) {
    auto b = static_cast<unsigned char>(s[i + k]);
    bool ok = k == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t i) {
  size_t need = 0;
  size_t k = valid_prefix(s, i, need);
  return k == need ? need : 0;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t n = utf8_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t need = 0;
    size_t k = valid_prefix(s, i, need);
    if (need != 0 && k == need) {
      out.append(s.substr(i, k));
      i += k;
    } else {
      out.append("\xEF\xBF\xBD");
      i += k == 0 ? 1 : k;  // a lone bad byte, or the maximal valid-so-far prefix, becomes one U+FFFD
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A sequence is at most 4 bytes: look at the last 3 for the start of an unfinished one.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > start;) {
    auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 0;
    size_t k = valid_prefix(s, i, need);
    if (need > 1 && k == s.size() - i && k < need) return k;
    return 0;
  }
  return 0;
}

uint32_t utf8_decode(std::string_view s, size_t& i) {
  auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t n = expected_length(b0);
  uint32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace moeserve::text
