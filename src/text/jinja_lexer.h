#pragma once
// Jinja2 lexing: the template source becomes text chunks and the tokens inside {{ }} and {% %}, with the
// whitespace control ({%- -%}, trim_blocks, lstrip_blocks) already applied to the text. Internal.

#include <cstdint>
#include <string>
#include <vector>

#include "text/jinja.h"

namespace moeserve::text::jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;  // text chunk, name, decoded string literal or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

std::vector<Token> lex(const std::string& source, const Options& options);

}  // namespace moeserve::text::jinja
