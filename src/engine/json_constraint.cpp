#include "engine/json_constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace moeserve {

using json = nlohmann::json;

using Node = JsonSchema::Node;

namespace {

constexpr size_t kMaxProperties = 64;  // a property set is a 64-bit mask
constexpr size_t kMaxDepth = 128;      // nesting the matcher follows (bounds its stack)

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

uint8_t literal_type(const json& v) {
  switch (v.type()) {
    case json::value_t::string:
      return Node::kString;
    case json::value_t::boolean:
      return Node::kBoolean;
    case json::value_t::null:
      return Node::kNull;
    case json::value_t::number_float:
      return Node::kNumber;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return Node::kNumber | Node::kInteger;
    default:
      return 0;
  }
}

}  // namespace

class SchemaCompiler {
 public:
  SchemaCompiler(JsonSchema& out, const json& document) : out_(out), document_(document) {}

  int any() {
    if (any_ < 0) {
      any_ = add();
      Node& n = out_.nodes_[size_t(any_)];
      n.types = Node::kAll;
      n.additional = any_;
      n.items = any_;
    }
    return any_;
  }

  int compile(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("false", path, "a schema of false admits no value");
      return any();
    }
    if (!s.is_object()) fail("schema", path, "a schema must be an object or a boolean");
    if (auto ref = s.find("$ref"); ref != s.end()) return reference(s, *ref, path);
    for (const char* keyword : {"anyOf", "oneOf"})
      if (s.contains(keyword)) return alternatives(s, keyword, path);
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kKnown = {
          "type",      "enum",     "const",      "properties", "required",    "additionalProperties",
          "items",     "minItems", "maxItems",   "title",      "description", "default",
          "examples",  "$schema",  "$id",        "$comment",   "deprecated",  "readOnly",
          "writeOnly", "$defs",    "definitions"};
      if (!kKnown.count(it.key()))
        fail(it.key(), path, fmt::format("the keyword '{}' is not supported in structured output", it.key()));
    }
    const int index = add();
    Node n;
    if (auto t = s.find("type"); t != s.end()) {
      std::vector<json> names = t->is_array() ? t->get<std::vector<json>>() : std::vector<json>{*t};
      for (const json& name : names) n.types |= type_bit(name, path);
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      n.types = Node::kObject;  // no type, but only object keywords: an object
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      n.types = Node::kArray;
    } else {
      n.types = Node::kAll;
    }
    if (n.types & Node::kNumber) n.types &= uint8_t(~Node::kInteger);  // number covers integer
    if (s.contains("enum") || s.contains("const")) literals(s, path, n);
    check_applies(s, path, n.types);
    if (n.types & Node::kObject) object(s, path, n);
    if (n.types & Node::kArray) array(s, path, n);
    out_.nodes_[size_t(index)] = std::move(n);
    return index;
  }

 private:
  [[noreturn]] static void fail(const std::string& keyword, const std::string& path, const std::string& msg) {
    throw SchemaError(keyword, path, path.empty() ? msg : fmt::format("{} (at {})", msg, path));
  }

  int add() {
    out_.nodes_.emplace_back();
    return int(out_.nodes_.size()) - 1;
  }

  static std::string child(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  static uint8_t type_bit(const json& name, const std::string& path) {
    static const std::map<std::string, uint8_t> kTypes = {
        {"object", Node::kObject}, {"array", Node::kArray},     {"string", Node::kString},
        {"number", Node::kNumber}, {"integer", Node::kInteger}, {"boolean", Node::kBoolean},
        {"null", Node::kNull}};
    auto it = name.is_string() ? kTypes.find(name.get<std::string>()) : kTypes.end();
    if (it == kTypes.end()) fail("type", path, fmt::format("unknown type {}", name.dump()));
    return it->second;
  }

  // Local references only: "#", "#/$defs/Name", "#/definitions/Name" (any JSON pointer into the document).
  int reference(const json& s, const json& ref, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kAnnotations = {
          "$ref", "title", "description", "default", "examples", "$comment", "$defs", "definitions"};
      if (!kAnnotations.count(it.key()))
        fail(it.key(), path, fmt::format("'{}' next to $ref is not supported", it.key()));
    }
    if (!ref.is_string() || ref.get<std::string>().empty() || ref.get<std::string>()[0] != '#')
      fail("$ref", path, "only local references ('#/$defs/Name') are supported");
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    const std::string pointer = target.substr(1);
    json::json_pointer ptr;
    try {
      ptr = json::json_pointer(pointer);
    } catch (const std::exception&) {
      fail("$ref", path, fmt::format("'{}' is not a JSON pointer", target));
    }
    if (!document_.contains(ptr)) fail("$ref", path, fmt::format("'{}' points at nothing", target));
    // Reserve the node first so a recursive schema refers to itself.
    const int index = add();
    refs_[target] = index;
    const int body = compile(document_.at(ptr), target);
    out_.nodes_[size_t(index)] = out_.nodes_[size_t(body)];
    return index;
  }

  // anyOf / oneOf whose alternatives have different types (Optional[X] is X or null): the first byte of a
  // value picks the alternative, so one node of their union is exact, and exactly one alternative matches.
  // Alternatives of the same type (two objects, integer and number) would need the matcher to follow several
  // at once; they are refused.
  int alternatives(const json& s, const char* keyword, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kAnnotations = {"anyOf",       "oneOf",   "title",
                                                         "description", "default", "examples",
                                                         "$comment",    "$defs",   "definitions"};
      if (!kAnnotations.count(it.key()))
        fail(it.key(), path, fmt::format("'{}' next to {} is not supported", it.key(), keyword));
    }
    const json& alts = s.at(keyword);
    if (!alts.is_array() || alts.empty())
      fail(keyword, path, fmt::format("{} must be a non-empty array", keyword));
    const int index = add();
    Node merged;
    uint8_t classes = 0;  // integer and number are one class: both start with a digit
    for (size_t i = 0; i < alts.size(); ++i) {
      const Node n = out_.nodes_[size_t(compile(alts[i], fmt::format("{}[{}]", child(path, keyword), i)))];
      if (n.types == 0)
        fail(keyword, path, fmt::format("a recursive reference inside {} is not supported", keyword));
      uint8_t types = n.types;
      if (!n.literals.empty()) {
        if (i > 0 && merged.literals.empty())
          fail(keyword, path,
               fmt::format("{} mixing enum/const and typed alternatives is not supported", keyword));
        types = 0;
        for (const std::string& l : n.literals) types |= literal_type(json::parse(l));
        merged.literals.insert(merged.literals.end(), n.literals.begin(), n.literals.end());
      } else if (!merged.literals.empty()) {
        fail(keyword, path,
             fmt::format("{} mixing enum/const and typed alternatives is not supported", keyword));
      }
      const uint8_t cls = types & (Node::kNumber | Node::kInteger) ? uint8_t(types | Node::kNumber) : types;
      if (classes & cls)
        fail(keyword, path,
             fmt::format("{} alternatives of the same type are not supported (each must start differently: "
                         "object, array, string, number, boolean, null)",
                         keyword));
      classes |= cls;
      merged.types |= n.types;
      if (n.types & Node::kObject) {
        merged.keys = n.keys, merged.values = n.values;
        merged.required = n.required, merged.additional = n.additional;
      }
      if (n.types & Node::kArray)
        merged.items = n.items, merged.min_items = n.min_items, merged.max_items = n.max_items;
    }
    out_.nodes_[size_t(index)] = std::move(merged);
    return index;
  }

  void literals(const json& s, const std::string& path, Node& n) {
    std::vector<json> values;
    if (auto c = s.find("const"); c != s.end()) values.push_back(*c);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail("enum", path, "enum must be a non-empty array");
      if (s.contains("const")) fail("enum", path, "enum together with const is not supported");
      values = e->get<std::vector<json>>();
    }
    const char* keyword = s.contains("const") ? "const" : "enum";
    for (const json& v : values) {
      const uint8_t t = literal_type(v);
      if (!t) fail(keyword, path, "only strings, numbers, booleans and null are supported in enum/const");
      if (t & n.types) n.literals.push_back(v.dump());
    }
    if (n.literals.empty()) fail(keyword, path, "no value of the enum/const has the schema's type");
  }

  static void check_applies(const json& s, const std::string& path, uint8_t types) {
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (s.contains(k) && !(types & Node::kObject)) fail(k, path, fmt::format("'{}' needs type object", k));
    for (const char* k : {"items", "minItems", "maxItems"})
      if (s.contains(k) && !(types & Node::kArray)) fail(k, path, fmt::format("'{}' needs type array", k));
  }

  void object(const json& s, const std::string& path, Node& n) {
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) fail("properties", path, "properties must be an object");
      if (p->size() > kMaxProperties)
        fail("properties", path, fmt::format("at most {} properties are supported", kMaxProperties));
      for (auto it = p->begin(); it != p->end(); ++it) {
        n.keys.push_back(json(it.key()).dump());
        n.values.push_back(compile(it.value(), child(path, "properties." + it.key())));
      }
    }
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail("required", path, "required must be an array of property names");
      for (const json& name : *r) {
        const std::string key = name.is_string() ? json(name).dump() : "";
        auto at = std::find(n.keys.begin(), n.keys.end(), key);
        if (at == n.keys.end())
          fail("required", path, fmt::format("required names {}, which is not in properties", name.dump()));
        n.required |= uint64_t(1) << (at - n.keys.begin());
      }
    }
    // Unlisted keys only when the schema allows them (xgrammar's strict mode, vLLM's default).
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (a->is_boolean()) {
        if (a->get<bool>()) n.additional = any();
      } else {
        n.additional = compile(*a, child(path, "additionalProperties"));
      }
    } else if (!s.contains("properties")) {
      n.additional = any();  // a bare {"type": "object"}: any object
    }
  }

  void array(const json& s, const std::string& path, Node& n) {
    if (auto i = s.find("items"); i != s.end()) {
      if (i->is_array()) fail("items", path, "tuple items (an array of schemas) are not supported");
      if (i->is_boolean() && !i->get<bool>()) {
        n.max_items = 0;
        n.items = any();
      } else {
        n.items = compile(*i, child(path, "items"));
      }
    } else {
      n.items = any();
    }
    auto count = [&](const char* k) -> int64_t {
      const json& v = s.at(k);
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(k, path, fmt::format("{} must be >= 0", k));
      return v.get<int64_t>();
    };
    if (s.contains("minItems")) n.min_items = count("minItems");
    if (s.contains("maxItems")) n.max_items = count("maxItems");
    if (n.max_items >= 0 && n.min_items > n.max_items) fail("minItems", path, "minItems exceeds maxItems");
  }

  JsonSchema& out_;
  const json& document_;
  std::map<std::string, int> refs_;
  int any_ = -1;
};

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto s = std::make_shared<JsonSchema>();
  SchemaCompiler(*s, json::object()).compile(json{{"type", "object"}}, "");
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema) {
  auto s = std::make_shared<JsonSchema>();
  SchemaCompiler(*s, schema).compile(schema, "");  // the root's node is the first one made: node 0
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// The matcher.

using Frame = JsonMatcher::Frame;

namespace {

// Object phases.
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNext };
// Array phases.
enum : uint8_t { kArrOpen, kArrItem, kArrAfter };
// String phases. A \u escape's value so far is in the frame's `seen`; `count` is 1 while a high surrogate
// waits for its low half (the object fields are unused in a string).
enum : uint8_t { kStrChar, kStrEscape, kStrHex1, kStrHex2, kStrHex3, kStrHex4, kStrWantBackslash, kStrWantU };
// Number phases (accepting: kNumZero, kNumInt, kNumFrac, kNumExp).
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

constexpr std::string_view kWords[] = {"true", "false", "null"};

bool number_accepting(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
}

bool literal_complete(const Frame& f) {
  return std::any_of(f.alive.begin(), f.alive.end(), [&](std::string_view s) { return s.size() == f.pos; });
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  Frame root;
  root.kind = Frame::kRoot;
  stack_.push_back(root);
  Frame value;
  value.kind = Frame::kValue;
  value.node = 0;
  stack_.push_back(value);
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  JsonMatcher copy = *this;
  for (char c : bytes)
    if (!copy.feed(uint8_t(c))) return false;
  return true;
}

bool JsonMatcher::advance(std::string_view bytes) {
  JsonMatcher copy = *this;
  for (char c : bytes)
    if (!copy.feed(uint8_t(c))) return false;
  *this = std::move(copy);
  return true;
}

bool JsonMatcher::can_end() const {
  const Frame& top = stack_.back();
  if (top.kind == Frame::kRoot) return true;
  if (stack_.size() != 2) return false;
  if (top.kind == Frame::kNumber) return number_accepting(top.phase);
  if (top.kind == Frame::kLiteral) return literal_complete(top);
  return false;
}

// The frame on top finished; tell its parent (now on top).
bool JsonMatcher::child_done() {
  Frame done = std::move(stack_.back());
  stack_.pop_back();
  Frame& f = stack_.back();
  const Node& n = schema_->node(f.node);
  switch (f.kind) {
    case Frame::kRoot:
      f.phase = 1;
      return true;
    case Frame::kArray:
      ++f.count, f.phase = kArrAfter;
      return true;
    case Frame::kObject:
      if (f.phase == kObjValue) {
        f.phase = kObjAfter;
        return true;
      }
      // A key: which property it names.
      f.key = -1;
      for (size_t i = 0; i < n.keys.size(); ++i) {
        const bool match = done.kind == Frame::kLiteral
                               ? std::any_of(done.alive.begin(), done.alive.end(),
                                             [&](std::string_view s) {
                                               return s.data() == n.keys[i].data() && s.size() == done.pos;
                                             })
                               : n.keys[i].size() == done.raw.size() + 2 &&
                                     n.keys[i].compare(1, done.raw.size(), done.raw) == 0;
        if (match) f.key = int(i);
      }
      if (f.key >= 0) f.seen |= uint64_t(1) << f.key;
      f.phase = kObjColon;
      return true;
    default:
      return false;
  }
}

bool JsonMatcher::feed(uint8_t c) {
  // Whitespace between tokens of JSON: accepted where `allowed`, at most kMaxWhitespaceRun in a row.
  auto whitespace = [&](bool allowed) {
    if (!allowed || !is_ws(c) || whitespace_run_ >= kMaxWhitespaceRun) return false;
    ++whitespace_run_;
    return true;
  };
  for (;;) {
    Frame& f = stack_.back();
    const Node& n = schema_->node(f.node);
    if (whitespace(f.kind == Frame::kRoot || f.kind == Frame::kValue || f.kind == Frame::kObject ||
                   f.kind == Frame::kArray))
      return true;
    if (!is_ws(c) || f.kind == Frame::kString) whitespace_run_ = 0;
    switch (f.kind) {
      case Frame::kRoot:
        return false;  // the value is complete; only whitespace may follow

      case Frame::kValue: {
        if (!n.literals.empty() || ((c == 't' || c == 'f') && (n.types & Node::kBoolean)) ||
            (c == 'n' && (n.types & Node::kNull))) {
          f.kind = Frame::kLiteral;
          if (!n.literals.empty()) {
            for (const std::string& s : n.literals) f.alive.push_back(s);
          } else {
            for (std::string_view w : kWords)
              if (n.types & (w == "null" ? Node::kNull : Node::kBoolean)) f.alive.push_back(w);
          }
          continue;  // the literal takes this byte
        }
        // Containers only up to kMaxDepth (scalars still fit there).
        const bool deeper = stack_.size() < kMaxDepth;
        if (c == '{' && (n.types & Node::kObject) && deeper) {
          f.kind = Frame::kObject;
          f.phase = kObjOpen;
          return true;
        }
        if (c == '[' && (n.types & Node::kArray) && deeper) {
          f.kind = Frame::kArray;
          f.phase = kArrOpen;
          return true;
        }
        if (c == '"' && (n.types & Node::kString)) {
          f.kind = Frame::kString;
          f.phase = kStrChar;
          return true;
        }
        if ((c == '-' || is_digit(c)) && (n.types & (Node::kNumber | Node::kInteger))) {
          f.kind = Frame::kNumber;
          f.phase = kNumStart;
          continue;
        }
        return false;
      }

      case Frame::kLiteral: {
        std::vector<std::string_view> next;
        for (std::string_view s : f.alive)
          if (s.size() > f.pos && uint8_t(s[f.pos]) == c) next.push_back(s);
        if (next.empty()) {
          if (!literal_complete(f) || !child_done()) return false;
          continue;  // the literal ended before this byte: the parent takes it
        }
        f.alive = std::move(next);
        ++f.pos;
        // Done when no longer text is possible: tell the parent now.
        if (std::all_of(f.alive.begin(), f.alive.end(),
                        [&](std::string_view s) { return s.size() == f.pos; }))
          return child_done();
        return true;
      }

      case Frame::kNumber: {
        const bool integer = !(n.types & Node::kNumber);
        uint8_t next = 0xFF;
        switch (f.phase) {
          case kNumStart:
            next = c == '-' ? kNumMinus : c == '0' ? kNumZero : is_digit(c) ? kNumInt : 0xFF;
            break;
          case kNumMinus:
            next = c == '0' ? kNumZero : is_digit(c) ? kNumInt : 0xFF;
            break;
          case kNumZero:
          case kNumInt:
            if (f.phase == kNumInt && is_digit(c))
              next = kNumInt;
            else if (c == '.' && !integer)
              next = kNumDot;
            else if ((c == 'e' || c == 'E') && !integer)
              next = kNumE;
            break;
          case kNumDot:
            next = is_digit(c) ? kNumFrac : 0xFF;
            break;
          case kNumFrac:
            next = is_digit(c) ? kNumFrac : (c == 'e' || c == 'E') ? kNumE : 0xFF;
            break;
          case kNumE:
            next = (c == '+' || c == '-') ? kNumESign : is_digit(c) ? kNumExp : 0xFF;
            break;
          case kNumESign:
            next = is_digit(c) ? kNumExp : 0xFF;
            break;
          case kNumExp:
            next = is_digit(c) ? kNumExp : 0xFF;
            break;
        }
        if (next != 0xFF) {
          f.phase = next;
          return true;
        }
        if (!number_accepting(f.phase) || !child_done()) return false;
        continue;
      }

      case Frame::kString: {
        if (f.utf8_left) {  // inside a multi-byte UTF-8 character
          if (c < f.utf8_lo || c > f.utf8_hi) return false;
          --f.utf8_left;
          f.utf8_lo = 0x80, f.utf8_hi = 0xBF;
          if (f.capture) f.raw.push_back(char(c));
          return true;
        }
        switch (f.phase) {
          case kStrChar:
            if (c == '"') return child_done();
            if (c == '\\') {
              f.phase = kStrEscape;
            } else if (c < 0x20) {
              return false;
            } else if (c >= 0x80) {
              // Well-formed UTF-8 only (no overlongs, no surrogates, nothing past U+10FFFF).
              if (c >= 0xC2 && c <= 0xDF)
                f.utf8_left = 1;
              else if (c == 0xE0)
                f.utf8_left = 2, f.utf8_lo = 0xA0;
              else if (c == 0xED)
                f.utf8_left = 2, f.utf8_hi = 0x9F;
              else if (c >= 0xE1 && c <= 0xEF)
                f.utf8_left = 2;
              else if (c == 0xF0)
                f.utf8_left = 3, f.utf8_lo = 0x90;
              else if (c >= 0xF1 && c <= 0xF3)
                f.utf8_left = 3;
              else if (c == 0xF4)
                f.utf8_left = 3, f.utf8_hi = 0x8F;
              else
                return false;
            }
            break;
          case kStrWantBackslash:
            if (c != '\\') return false;
            f.phase = kStrWantU;
            break;
          case kStrEscape:
          case kStrWantU:
            if (f.phase == kStrWantU && c != 'u') return false;
            if (c == 'u') {
              f.phase = kStrHex1;
              f.seen = 0;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                       c == 't') {
              f.phase = kStrChar;
            } else {
              return false;
            }
            break;
          default: {  // hex digits of \uXXXX; surrogates only in pairs (parsers reject lone ones)
            if (!is_hex(c)) return false;
            const uint64_t digit = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
            f.seen = f.seen * 16 + digit;
            const bool want_low = f.count == 1;  // after a high surrogate: DC00..DFFF
            if (f.phase == kStrHex1 && want_low && digit != 0xD) return false;
            const bool low = f.seen >= 0xDC && f.seen <= 0xDF;
            if (f.phase == kStrHex2 && low != want_low) return false;
            if (f.phase == kStrHex4) {
              f.count = !want_low && f.seen >= 0xD800 && f.seen <= 0xDBFF ? 1 : 0;
              f.phase = f.count ? kStrWantBackslash : kStrChar;
            } else {
              ++f.phase;
            }
          }
        }
        if (f.capture) f.raw.push_back(char(c));
        return true;
      }

      case Frame::kObject: {
        const uint64_t all = n.keys.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.keys.size()) - 1;
        const bool more_keys = n.additional >= 0 || (f.seen & all) != all;
        const bool may_close = (f.seen & n.required) == n.required;
        auto start_key = [&] {
          Frame k;
          k.node = f.node;
          if (n.additional >= 0) {
            k.kind = Frame::kString;
            k.capture = true;
          } else {
            k.kind = Frame::kLiteral;
            for (size_t i = 0; i < n.keys.size(); ++i)
              if (!(f.seen >> i & 1)) k.alive.push_back(n.keys[i]);
            k.pos = 1;  // past the opening quote, which the object consumed
          }
          f.phase = kObjKey;
          stack_.push_back(std::move(k));
          return true;
        };
        switch (f.phase) {
          case kObjOpen:
            if (c == '"' && more_keys) return start_key();
            if (c == '}' && may_close) return child_done();
            return false;
          case kObjNext:
            return c == '"' && start_key();
          case kObjColon: {
            if (c != ':') return false;
            Frame v;
            v.node = f.key >= 0 ? n.values[size_t(f.key)] : n.additional;
            f.phase = kObjValue;
            stack_.push_back(std::move(v));
            return true;
          }
          case kObjAfter:
            if (c == ',' && more_keys) {
              f.phase = kObjNext;
              return true;
            }
            if (c == '}' && may_close) return child_done();
            return false;
          default:
            return false;
        }
      }

      case Frame::kArray: {
        const bool more = n.max_items < 0 || f.count < n.max_items;
        if (f.phase == kArrOpen || f.phase == kArrAfter) {
          if (c == ']' && f.count >= n.min_items) return child_done();
          const bool comma = f.phase == kArrAfter;
          if (!more || (comma && c != ',')) return false;
          Frame v;
          v.node = n.items;
          f.phase = kArrItem;
          stack_.push_back(std::move(v));
          if (comma) return true;
          continue;  // the first item's first byte
        }
        return false;
      }
    }
  }
}

}  // namespace moeserve
