#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "common/error.h"

namespace moeserve::text {

namespace {

// Oniguruma's Unicode \s is the White_Space property, which includes U+0085; PCRE2's UCP \s does not.
// Rewrites \s and \S (outside character classes) and \s (inside) so that both engines agree.
std::string onig_compatible(const std::string& p) {
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  std::string translated = onig_compatible(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regex /{}/ does not compile: {} at offset {}", pattern, reinterpret_cast<char*>(message), offset);
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::find(std::string_view subject, size_t start, size_t& begin, size_t& end) const {
  MatchScratch& s = scratch();
  auto* code = static_cast<pcre2_code*>(code_);
  auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = jit_ ? pcre2_jit_match(code, text, subject.size(), start, PCRE2_NO_UTF_CHECK, s.data, s.context)
                : pcre2_match(code, text, subject.size(), start, PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    fail("regex /{}/ failed on a {}-byte input: {}", pattern_, subject.size(),
         reinterpret_cast<char*>(message));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  begin = ov[0];
  end = ov[1];
  return true;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace moeserve::text
