#include "common/parameter_type.h"

#include <cctype>
#include <cmath>
#include <stdexcept>

#include "common/bounded_json.h"

namespace moeserve {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr int kMaxRefHops = 16;  // a $ref chain longer than this (or a cycle) gives no type

std::string named_type(const json& type) {
  if (type.is_string()) return type.get<std::string>() == "null" ? "" : type.get<std::string>();
  if (type.is_array())
    for (const json& t : type)
      if (t.is_string() && t.get<std::string>() != "null") return t.get<std::string>();
  return "";
}

bool names_null(const json& type) {
  if (type.is_string()) return type.get<std::string>() == "null";
  if (type.is_array())
    for (const json& t : type)
      if (t.is_string() && t.get<std::string>() == "null") return true;
  return false;
}

const json* resolve(const json& schema, const json& document) {
  const json* s = &schema;
  for (int hop = 0; s->is_object() && s->contains("$ref"); ++hop) {
    const json& ref = (*s)["$ref"];
    if (hop == kMaxRefHops || !ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0) return nullptr;
    try {
      const json::json_pointer ptr(ref.get<std::string>().substr(1));
      if (!document.contains(ptr)) return nullptr;
      s = &document.at(ptr);
    } catch (const json::exception&) {
      return nullptr;
    }
  }
  return s;
}

}  // namespace

ParameterType parameter_type(const json& schema, const json& document) {
  ParameterType out;
  const json* s = resolve(schema, document);
  if (!s || !s->is_object()) return out;
  if (auto t = s->find("type"); t != s->end()) {
    out.type = named_type(*t);
    out.nullable = names_null(*t);
    return out;
  }
  for (const char* keyword : {"anyOf", "oneOf"}) {
    auto alts = s->find(keyword);
    if (alts == s->end() || !alts->is_array()) continue;
    for (const json& alt : *alts) {
      const ParameterType a = parameter_type(alt, document);
      if (out.type.empty()) out.type = a.type;
      const json* r = resolve(alt, document);
      out.nullable |= a.nullable || (r && r->is_object() && r->contains("type") && names_null((*r)["type"]));
    }
    return out;
  }
  // allOf: the type its parts name (each value passes every part); null only where every part that names
  // a type names null.
  if (auto parts = s->find("allOf"); parts != s->end() && parts->is_array()) {
    bool typed = false;
    out.nullable = true;
    for (const json& part : *parts) {
      const json* r = resolve(part, document);
      if (!r || !r->is_object() || !(r->contains("type") || r->contains("allOf"))) continue;
      const ParameterType p = parameter_type(part, document);
      if (out.type.empty()) out.type = p.type;
      out.nullable &= p.nullable;
      typed = true;
    }
    out.nullable &= typed;
    if (typed) return out;
  }
  std::vector<const json*> values;
  if (auto c = s->find("const"); c != s->end()) values.push_back(&*c);
  if (auto e = s->find("enum"); e != s->end() && e->is_array())
    for (const json& v : *e) values.push_back(&v);
  bool strings = !values.empty();
  for (const json* v : values) {
    strings &= v->is_string() || v->is_null();
    out.nullable |= v->is_null();
  }
  if (strings) out.type = "string";
  return out;
}

ordered_json convert_parameter(const std::string& raw, const ParameterType& p) {
  const std::string& type = p.type;
  std::string lower;
  for (char c : raw) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "null" && (type != "string" || p.nullable)) return nullptr;
  if (type == "integer" || type == "int" || type == "number" || type == "float") {
    const bool integer = type == "integer" || type == "int";
    try {
      size_t used = 0;
      if (integer) {
        long long v = std::stoll(raw, &used);
        if (used == raw.size()) return v;
      } else {
        double v = std::stod(raw, &used);
        if (used == raw.size() && std::isfinite(v)) {
          if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<long long>(v);
          return v;
        }
      }
    } catch (const std::out_of_range&) {
      // Past long long or double's range ("1e-400", twenty digits): JSON's reading, when finite.
      auto parsed = parse_bounded_json_or_discarded<ordered_json>(raw);
      if (!parsed.is_discarded() && parsed.is_number() && std::isfinite(parsed.get<double>()) &&
          (!integer || !parsed.is_number_float() || parsed.get<double>() == std::floor(parsed.get<double>())))
        return parsed;
    } catch (const std::exception&) {
    }
    return raw;
  }
  if (type == "boolean" || type == "bool") {
    if (lower == "true") return true;
    if (lower == "false") return false;
    return raw;
  }
  if (type == "object" || type == "array" || type == "dict" || type == "list") {
    auto parsed = parse_bounded_json_or_discarded<ordered_json>(raw);
    if (!parsed.is_discarded()) return parsed;
    return raw;
  }
  return raw;
}

}  // namespace moeserve
