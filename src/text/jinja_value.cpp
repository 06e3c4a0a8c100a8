#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "text/jinja.h"

namespace moeserve::text::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* Args::kw(std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d->items.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(d));
    }
    default:
      return none();
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !str_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::type_repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool object";
    case Kind::kInt:
      return "int object";
    case Kind::kFloat:
      return "float object";
    case Kind::kString:
      return "str object";
    case Kind::kList:
      return "list object";
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace object" : "dict object";
    case Kind::kCallable:
      return "function object";
  }
  return "object";
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for exponents in [-4, 16), else scientific.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return out;
}

namespace {

std::string string_repr(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      double f = v.as_float();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(f);
      }
      return;
    }
    case Value::Kind::kString:
      json_string(v.as_string(), out);
      return;
    case Value::Kind::kList: {
      const List& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(l[i], indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(items[i]->first, out);
        out += ": ";
        json_dump(items[i]->second, indent, sort_keys, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      throw TemplateError("TypeError", "Object of type Undefined is not JSON serializable");
    case Value::Kind::kCallable:
      throw TemplateError("TypeError", "Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_dump(v, indent, sort_keys, 0, out);
  return out;
}

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return string_repr(v.as_string());
    case Value::Kind::kList: {
      std::string out = "[";
      const List& l = v.as_list();
      for (size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + repr(l[i]);
      return out + "]";
    }
    case Value::Kind::kDict: {
      if (v.as_dict().is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.as_dict().items) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + repr(val);
        first = false;
      }
      return out + "}";
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return to_string(v);
  }
}

std::string to_string(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return float_repr(v.as_float());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kCallable:
      return "<function " + v.as_string() + ">";
    default:
      return repr(v);
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict_ptr() == b.dict_ptr()) return true;
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

}  // namespace moeserve::text::jinja
