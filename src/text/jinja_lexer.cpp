#include "text/jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "text/utf8.h"

namespace moeserve::text::jinja {

namespace {

[[noreturn]] void syntax_error(int line, const std::string& message) {
  throw TemplateError("TemplateSyntaxError", "line " + std::to_string(line) + ": " + message);
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  Lexer(const std::string& source, const Options& options) : src_(source), opt_(options) {}

  std::vector<Token> run() {
    bool strip_next = false;  // the previous tag ended with '-'
    while (true) {
      size_t start = find_tag(pos_);
      if (strip_next) {
        while (pos_ < start && pos_ < src_.size() && is_space(src_[pos_])) advance(1);
        strip_next = false;
      }
      if (start == std::string::npos) {
        emit_text(src_.substr(pos_));
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char modifier = start + 2 < src_.size() ? src_[start + 2] : '\0';
      std::string text = src_.substr(pos_, start - pos_);
      if (modifier == '-') {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (kind != '{' && opt_.lstrip_blocks && modifier != '+') {
        size_t l = text.rfind('\n');
        l = l == std::string::npos ? 0 : l + 1;
        bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
        if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) text.resize(l);
      }
      emit_text(text);
      advance(start - pos_);
      advance(2);
      if (modifier == '-' || modifier == '+') advance(1);
      if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) syntax_error(line_, "unterminated comment");
        strip_next = end > pos_ && src_[end - 1] == '-';
        advance(end + 2 - pos_);
        trim_newline();
        continue;
      }
      bool block = kind == '%';
      size_t first_token = tokens_.size();
      tokens_.push_back({block ? Tok::kBlockBegin : Tok::kVarBegin, "", 0, 0, line_});
      strip_next = lex_tag(block);
      if (block) {
        trim_newline();
        if (tokens_.size() == first_token + 3 && tokens_[first_token + 1].type == Tok::kName &&
            tokens_[first_token + 1].text == "raw") {
          tokens_.resize(first_token);
          strip_next = lex_raw(strip_next);
        }
      }
    }
    tokens_.push_back({Tok::kEnd, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  void advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < src_.size(); ++i, ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  void trim_newline() {
    if (opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') advance(1);
  }

  size_t find_tag(size_t from) const {
    size_t i = from;
    while ((i = src_.find('{', i)) != std::string::npos) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
      ++i;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Tok::kText, text, 0, 0, line_});
  }

  // Lexes expression tokens up to the closing %} or }}; returns whether the closer had a '-'.
  bool lex_tag(bool block) {
    const char close = block ? '%' : '}';
    int depth = 0;  // brackets: '}}' inside a dict literal is not the end of the tag
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance(1);
      if (pos_ >= src_.size())
        syntax_error(line_, block ? "unexpected end of template, expected '%}'"
                                  : "unexpected end of template, expected '}}'");
      char c = src_[pos_];
      auto at = [&](const char* s) { return src_.compare(pos_, std::strlen(s), s) == 0; };
      if (depth == 0) {
        if (c == '-' && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == close && src_[pos_ + 2] == '}') {
          advance(3);
          tokens_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", 0, 0, line_});
          return true;
        }
        if (c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
          advance(2);
          tokens_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", 0, 0, line_});
          return false;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        tokens_.push_back({Tok::kName, src_.substr(b, pos_ - b), 0, 0, line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : kTwo)
          if (at(t)) op = t;
        if (op.empty()) {
          if (std::strchr("+-*/%~<>=()[]{}.,:|!", c) == nullptr)
            syntax_error(line_, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        advance(op.size());
        tokens_.push_back({Tok::kOp, op, 0, 0, line_});
      }
    }
  }

  void lex_number() {
    size_t b = pos_;
    bool is_float = false;
    while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
      ++pos_;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
        ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t save = pos_++;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) {
        is_float = true;
        while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
      } else {
        pos_ = save;
      }
    }
    std::string digits;
    for (size_t i = b; i < pos_; ++i)
      if (src_[i] != '_') digits += src_[i];
    Token t{is_float ? Tok::kFloat : Tok::kInt, digits, 0, 0, line_};
    if (is_float) {
      t.float_value = std::stod(digits);
    } else {
      try {
        t.int_value = std::stoll(digits);
      } catch (const std::exception&) {
        syntax_error(line_, "integer literal " + digits + " is too large");
      }
    }
    tokens_.push_back(t);
  }

  void lex_string(char quote) {
    int line = line_;
    advance(1);
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) syntax_error(line, "unterminated string");
      char c = src_[pos_];
      if (c == quote) {
        advance(1);
        break;
      }
      if (c != '\\' || pos_ + 1 >= src_.size()) {
        out += c;
        advance(1);
        continue;
      }
      char e = src_[pos_ + 1];
      advance(2);
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case '0':
          out += '\0';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > src_.size()) syntax_error(line_, "truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = static_cast<uint32_t>(std::stoul(src_.substr(pos_, n), nullptr, 16));
          utf8_append(out, cp);
          advance(n);
          break;
        }
        default:  // Python keeps unknown escapes as written
          out += '\\';
          out += e;
      }
    }
    tokens_.push_back({Tok::kString, out, 0, 0, line});
  }

  // After {% raw %}: everything up to {% endraw %} is text. Returns whether endraw's closer had '-'.
  bool lex_raw(bool strip_after_open) {
    size_t i = pos_;
    while ((i = src_.find("{%", i)) != std::string::npos) {
      size_t j = i + 2;
      bool strip_before = j < src_.size() && src_[j] == '-';
      if (strip_before || (j < src_.size() && src_[j] == '+')) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") == 0) {
        j += 6;
        while (j < src_.size() && is_space(src_[j])) ++j;
        bool strip_after = j < src_.size() && src_[j] == '-';
        if (strip_after) ++j;
        if (src_.compare(j, 2, "%}") == 0) {
          std::string text = src_.substr(pos_, i - pos_);
          if (strip_after_open) {
            size_t b = 0;
            while (b < text.size() && is_space(text[b])) ++b;
            text.erase(0, b);
          }
          if (strip_before) {
            size_t e = text.size();
            while (e > 0 && is_space(text[e - 1])) --e;
            text.resize(e);
          }
          emit_text(text);
          advance(j + 2 - pos_);
          trim_newline();
          return strip_after;
        }
      }
      i += 2;
    }
    syntax_error(line_, "missing {% endraw %}");
  }

  std::string src_;
  const Options& opt_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const Options& options) {
  // Jinja normalizes newlines and drops one trailing newline unless keep_trailing_newline is set.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(src, options).run();
}

}  // namespace moeserve::text::jinja
