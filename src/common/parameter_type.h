#pragma once
// The type by which a tool call's parameter, written as text in Qwen3.5's XML format
// (<parameter=NAME>\nVALUE\n</parameter>), is read back into JSON. One rule for the two sides that must
// agree: the tool parser that converts the text (text/output_parser.cpp) and the constraint that makes a
// forced call write text the parser turns into valid arguments (engine/json_constraint.cpp).

#include <nlohmann/json.hpp>
#include <string>

namespace moeserve {

struct ParameterType {
  // "string", "integer", "number", "boolean", "object", "array", or "" (none given: the text stays a string).
  std::string type;
  // The schema admits null: the text "null" (any case) is read as null. Without it, only for non-strings.
  bool nullable = false;
};

// The type of a property's schema: its `type` (the first one that is not "null"), else that of the first
// anyOf/oneOf alternative that has one, else the one allOf's parts name, else "string" for an enum/const of
// strings. Local $refs are followed
// into `document` (the function's parameters). `schema` need not be valid: what is not understood is "".
ParameterType parameter_type(const nlohmann::json& schema, const nlohmann::json& document);

// The value of a parameter's text by its type; what does not convert stays the string.
nlohmann::ordered_json convert_parameter(const std::string& text, const ParameterType& type);

}  // namespace moeserve
