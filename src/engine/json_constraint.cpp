#include "engine/json_constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <type_traits>

namespace moeserve {

using json = nlohmann::json;

using Node = JsonSchema::Node;

namespace {

constexpr size_t kMaxObjectProperties = 64;  // an object's property set is a 64-bit mask
constexpr uint32_t kNone = JsonTrie::kNone;

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

// A name or value as an error message may show it: at most 40 bytes (cut at a character boundary).
std::string brief(std::string_view s) {
  constexpr size_t kMax = 40;
  if (s.size() <= kMax) return std::string(s);
  size_t end = kMax;
  while (end > 0 && (uint8_t(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end)) + "...";
}

std::string describe(const json& v) {
  if (v.is_string()) return "'" + brief(v.get_ref<const std::string&>()) + "'";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return v.dump();  // a number, boolean or null: short
}

// Adds the trie of `strings` (text, tag) to `t` and returns its root. Built breadth-first from the sorted
// strings, a node being the range of them that share its prefix, so the nodes' edges come out in node order.
using Tagged = std::vector<std::pair<std::string_view, int8_t>>;

uint32_t build_trie(JsonTrie& t, Tagged strings, bool masks) {
  std::sort(strings.begin(), strings.end());
  strings.erase(std::unique(strings.begin(), strings.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                strings.end());
  struct Range {
    uint32_t lo, hi, depth;
  };
  const uint32_t root = t.size();
  std::vector<Range> queue = {{0, uint32_t(strings.size()), 0}};
  t.first_edge.pop_back();  // the end of the last node's edges, pushed again at the end
  t.tag.push_back(-1);
  if (masks) t.below.push_back(0);
  for (size_t q = 0; q < queue.size(); ++q) {
    auto [lo, hi, depth] = queue[q];
    const uint32_t id = root + uint32_t(q);
    t.first_edge.push_back(uint32_t(t.edge_byte.size()));
    if (masks)
      for (uint32_t k = lo; k < hi; ++k) t.below[id] |= uint64_t(1) << strings[k].second;
    if (strings[lo].first.size() == depth) t.tag[id] = strings[lo++].second;  // sorted: the shortest first
    while (lo < hi) {
      const char byte = strings[lo].first[depth];
      uint32_t end = lo;
      while (end < hi && strings[end].first[depth] == byte) ++end;
      t.edge_byte.push_back(uint8_t(byte));
      t.edge_child.push_back(t.size());
      t.tag.push_back(-1);
      if (masks) t.below.push_back(0);
      queue.push_back({lo, end, depth + 1});
      lo = end;
    }
  }
  t.first_edge.push_back(uint32_t(t.edge_byte.size()));
  return root;
}

}  // namespace

uint32_t JsonTrie::child(uint32_t node, uint8_t byte) const {
  const auto first = edge_byte.begin() + first_edge[node], last = edge_byte.begin() + first_edge[node + 1];
  const auto at = std::lower_bound(first, last, byte);
  return at != last && *at == byte ? edge_child[size_t(at - edge_byte.begin())] : kNone;
}

uint8_t JsonSchemaNode::need() const {
  if (values != kNone || (types & ~(kObject | kArray))) return 0;
  return std::min(need_object, need_array);
}

class SchemaCompiler {
 public:
  SchemaCompiler(JsonSchema& out, const json& document, const JsonSchemaLimits& limits)
      : out_(out), document_(document), limits_(limits) {}

  int compile(const json& s) {
    // Before anything recurses: the C++ stack grows by one compile() per level.
    if (path_.size() > limits_.max_depth)
      fail("max_depth",
           fmt::format("the schema nests more than {} subschemas deep ($ref hops count)", limits_.max_depth));
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("false", "a schema of false admits no value");
      return any();
    }
    if (!s.is_object()) fail("schema", "a schema must be an object or a boolean");
    if (auto ref = s.find("$ref"); ref != s.end()) return reference(s, *ref);
    for (const char* keyword : {"anyOf", "oneOf"})
      if (s.contains(keyword)) return alternatives(s, keyword);
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kKnown = {
          "type",      "enum",     "const",      "properties", "required",    "additionalProperties",
          "items",     "minItems", "maxItems",   "title",      "description", "default",
          "examples",  "$schema",  "$id",        "$comment",   "deprecated",  "readOnly",
          "writeOnly", "$defs",    "definitions"};
      if (!kKnown.count(it.key()))
        fail(it.key(),
             fmt::format("the keyword '{}' is not supported in structured output", brief(it.key())));
    }
    const int index = add();
    Node n;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_array()) {
        for (const json& name : *t) n.types |= type_bit(name);
      } else {
        n.types = type_bit(*t);
      }
      if (!n.types) fail("type", "type must name at least one type");
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      n.types = Node::kObject;  // no type, but only object keywords: an object
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      n.types = Node::kArray;
    } else {
      n.types = Node::kAll;
    }
    if (n.types & Node::kNumber) n.types &= uint8_t(~Node::kInteger);  // number covers integer
    if (s.contains("enum") || s.contains("const")) literals(s, n, index);
    check_applies(s, n.types);
    if (n.types & Node::kObject) object(s, n);
    if (n.types & Node::kArray) array(s, n);
    out_.nodes_[size_t(index)] = std::move(n);
    return index;
  }

  // After compile(): the tries of what the root reaches, every node's need, and the checks that every
  // reference and the root have a value that fits.
  void finish() {
    build_tries();
    compute_needs();
    for (const auto& [target, index] : refs_)
      if (out_.nodes_[size_t(index)].need() == Node::kUnbounded)
        throw SchemaError("$ref", brief(target),
                          fmt::format("'{}' has no value within {} levels of nesting: what it requires "
                                      "(required properties, minItems) contains itself without end, or nests "
                                      "deeper",
                                      brief(target), kMaxNesting));
    if (out_.nodes_[0].need() == Node::kUnbounded)
      throw SchemaError(
          "max_nesting", "",
          fmt::format("every value of the schema nests more than {} containers deep", kMaxNesting));
  }

 private:
  // Where compile() is, as the path an error shows: segments from the last reference's target on.
  struct Segment {
    std::string text;
    bool restart = false;  // a $ref's target: the path starts again there
  };
  class Enter {
   public:
    Enter(std::vector<Segment>& path, std::string text, bool restart = false) : path_(path) {
      path_.push_back({std::move(text), restart});
    }
    ~Enter() { path_.pop_back(); }
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    std::vector<Segment>& path_;
  };

  int compile_at(const json& s, std::string segment, bool restart = false) {
    Enter enter(path_, std::move(segment), restart);
    return compile(s);
  }

  std::string path() const {
    size_t from = path_.size();
    while (from > 0 && !path_[from - 1].restart) --from;
    if (from > 0) --from;
    std::string out;
    for (size_t i = from; i < path_.size(); ++i) out += (out.empty() ? "" : ".") + path_[i].text;
    return out;
  }

  [[noreturn]] void fail(const std::string& keyword, const std::string& msg) const {
    const std::string where = path();
    throw SchemaError(keyword, where, where.empty() ? msg : fmt::format("{} (at {})", msg, where));
  }

  int add() {
    if (out_.nodes_.size() >= limits_.max_nodes)
      fail("max_nodes", fmt::format("the schema has more than {} subschemas", limits_.max_nodes));
    out_.nodes_.emplace_back();
    node_set_.push_back(-1);
    return int(out_.nodes_.size()) - 1;
  }

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

  uint8_t type_bit(const json& name) const {
    static const std::map<std::string, uint8_t> kTypes = {
        {"object", Node::kObject}, {"array", Node::kArray},     {"string", Node::kString},
        {"number", Node::kNumber}, {"integer", Node::kInteger}, {"boolean", Node::kBoolean},
        {"null", Node::kNull}};
    auto it = name.is_string() ? kTypes.find(name.get<std::string>()) : kTypes.end();
    if (it == kTypes.end()) fail("type", fmt::format("unknown type {}", describe(name)));
    return it->second;
  }

  // A value's canonical JSON text (what the matcher compares), counted against max_literal_bytes.
  std::string text_of(const json& v, const char* keyword) {
    std::string text;
    try {
      text = v.dump();
    } catch (const json::type_error&) {
      fail(keyword, "a string is not valid UTF-8");
    }
    literal_bytes_ += text.size();
    if (literal_bytes_ > limits_.max_literal_bytes)
      fail("max_literal_bytes", fmt::format("the schema's enum/const values and property names are more than "
                                            "{} bytes of JSON",
                                            limits_.max_literal_bytes));
    return text;
  }

  // Local references only: "#", "#/$defs/Name", "#/definitions/Name" (any JSON pointer into the document).
  // Each target is compiled once; a reference met again (recursion) gets the same node.
  int reference(const json& s, const json& ref) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kAnnotations = {
          "$ref", "title", "description", "default", "examples", "$comment", "$defs", "definitions"};
      if (!kAnnotations.count(it.key()))
        fail(it.key(), fmt::format("'{}' next to $ref is not supported", brief(it.key())));
    }
    if (!ref.is_string() || ref.get_ref<const std::string&>().empty() ||
        ref.get_ref<const std::string&>()[0] != '#')
      fail("$ref", "only local references ('#/$defs/Name') are supported");
    const std::string& target = ref.get_ref<const std::string&>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    const json* body = nullptr;
    try {
      const json::json_pointer ptr(target.substr(1));
      if (document_.contains(ptr)) body = &document_.at(ptr);
    } catch (const json::exception&) {
      fail("$ref", fmt::format("'{}' is not a JSON pointer", brief(target)));
    }
    if (!body) fail("$ref", fmt::format("'{}' points at nothing", brief(target)));
    // Reserve the node first so that a recursive schema refers to itself.
    const int index = add();
    refs_[target] = index;
    const int compiled = compile_at(*body, brief(target), true);
    if (out_.nodes_[size_t(compiled)].types == 0) {
      // The target is itself only a reference, to one still being compiled (an enclosing one).
      if (compiled == index)
        fail("$ref", fmt::format("'{}' refers to itself and nothing else", brief(target)));
      refs_[target] = compiled;
      return compiled;
    }
    out_.nodes_[size_t(index)] = out_.nodes_[size_t(compiled)];
    node_set_[size_t(index)] = node_set_[size_t(compiled)];
    return index;
  }

  std::string reference_name(int index) const {
    for (const auto& [target, i] : refs_)
      if (i == index) return target;
    return "?";
  }

  // anyOf / oneOf whose alternatives have different types (Optional[X] is X or null): the first byte of a
  // value picks the alternative, so one node of their union is exact, and exactly one alternative matches.
  // Alternatives of the same type (two objects, integer and number) would need the matcher to follow several
  // at once; they are refused. enum/const alternatives are one set of values, whatever their types.
  int alternatives(const json& s, const char* keyword) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kAnnotations = {"anyOf",       "oneOf",   "title",
                                                         "description", "default", "examples",
                                                         "$comment",    "$defs",   "definitions"};
      if (!kAnnotations.count(it.key()))
        fail(it.key(), fmt::format("'{}' next to {} is not supported", brief(it.key()), keyword));
    }
    const json& alts = s.at(keyword);
    if (!alts.is_array() || alts.empty()) fail(keyword, fmt::format("{} must be a non-empty array", keyword));
    const int index = add();
    Node merged;
    int merged_set = -1;
    uint8_t classes = 0;  // integer and number are one class: both start with a digit
    for (size_t i = 0; i < alts.size(); ++i) {
      const int alt = compile_at(alts[i], fmt::format("{}[{}]", keyword, i));
      const Node& n = out_.nodes_[size_t(alt)];
      if (n.types == 0)
        fail(keyword,
             fmt::format("'{}' is used inside {} within itself: recursion through {} is not supported",
                         brief(reference_name(alt)), keyword, keyword));
      if (const int set = node_set_[size_t(alt)]; set >= 0) {  // enum/const: all the values in one trie
        if (i > 0 && merged_set < 0)
          fail(keyword, fmt::format("{} mixing enum/const and typed alternatives is not supported", keyword));
        if (merged_set < 0) {
          merged_set = int(sets_.size());
          sets_.emplace_back();
        }
        std::vector<std::string>& m = sets_[size_t(merged_set)];
        const std::vector<std::string>& more = sets_[size_t(set)];
        m.insert(m.end(), more.begin(), more.end());
        merged.types |= n.types;
        continue;
      }
      if (merged_set >= 0)
        fail(keyword, fmt::format("{} mixing enum/const and typed alternatives is not supported", keyword));
      const uint8_t cls =
          n.types & (Node::kNumber | Node::kInteger) ? uint8_t(n.types | Node::kNumber) : n.types;
      if (classes & cls)
        fail(keyword, fmt::format("{} alternatives of the same type are not supported (each must start "
                                  "differently: object, array, string, number, boolean, null)",
                                  keyword));
      classes |= cls;
      merged.types |= n.types;
      if (n.types & Node::kObject) {
        merged.names = n.names, merged.properties = n.properties;
        merged.required = n.required, merged.additional = n.additional;
      }
      if (n.types & Node::kArray)
        merged.items = n.items, merged.min_items = n.min_items, merged.max_items = n.max_items;
    }
    out_.nodes_[size_t(index)] = std::move(merged);
    node_set_[size_t(index)] = merged_set;
    return index;
  }

  void literals(const json& s, Node& n, int index) {
    const json* values = nullptr;
    const json* one = nullptr;
    if (auto c = s.find("const"); c != s.end()) one = &*c;
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail("enum", "enum must be a non-empty array");
      if (one) fail("enum", "enum together with const is not supported");
      values = &*e;
    }
    const char* keyword = one ? "const" : "enum";
    enum_values_ += values ? values->size() : 1;
    if (enum_values_ > limits_.max_enum_values)
      fail("max_enum_values",
           fmt::format("the schema has more than {} enum/const values", limits_.max_enum_values));
    std::vector<std::string> set;
    auto take = [&](const json& v) {
      const uint8_t t = literal_type(v);
      if (!t) fail(keyword, "only strings, numbers, booleans and null are supported in enum/const");
      if (t & n.types) set.push_back(text_of(v, keyword));
    };
    if (values) {
      for (const json& v : *values) take(v);
    } else {
      take(*one);
    }
    if (set.empty()) fail(keyword, "no value of the enum/const has the schema's type");
    node_set_[size_t(index)] = int(sets_.size());
    sets_.push_back(std::move(set));
  }

  void check_applies(const json& s, uint8_t types) const {
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (s.contains(k) && !(types & Node::kObject)) fail(k, fmt::format("'{}' needs type object", k));
    for (const char* k : {"items", "minItems", "maxItems"})
      if (s.contains(k) && !(types & Node::kArray)) fail(k, fmt::format("'{}' needs type array", k));
  }

  void object(const json& s, Node& n) {
    std::map<std::string_view, int> index;  // property name -> its index
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) fail("properties", "properties must be an object");
      if (p->size() > kMaxObjectProperties)
        fail("properties", fmt::format("at most {} properties are supported", kMaxObjectProperties));
      properties_ += p->size();
      if (properties_ > limits_.max_properties)
        fail("max_properties", fmt::format("the schema has more than {} properties", limits_.max_properties));
      std::vector<std::string> texts;  // the names as JSON text
      for (auto it = p->begin(); it != p->end(); ++it) {
        const int8_t i = int8_t(n.properties.size());
        texts.push_back(text_of(json(it.key()), "properties"));
        index.emplace(it.key(), i);
        n.properties.push_back(compile_at(it.value(), "properties." + brief(it.key())));
      }
      Tagged names;
      for (size_t i = 0; i < texts.size(); ++i) names.emplace_back(texts[i], int8_t(i));
      if (!names.empty()) n.names = build_trie(out_.names_, std::move(names), true);
    }
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail("required", "required must be an array of property names");
      for (const json& name : *r) {
        auto at = name.is_string() ? index.find(name.get_ref<const std::string&>()) : index.end();
        if (at == index.end())
          fail("required", fmt::format("required names {}, which is not in properties", describe(name)));
        n.required |= uint64_t(1) << at->second;
      }
    }
    // Unlisted keys only when the schema allows them (xgrammar's strict mode, vLLM's default).
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (a->is_boolean()) {
        if (a->get<bool>()) n.additional = any();
      } else {
        n.additional = compile_at(*a, "additionalProperties");
      }
    } else if (!s.contains("properties")) {
      n.additional = any();  // a bare {"type": "object"}: any object
    }
  }

  void array(const json& s, Node& n) {
    if (auto i = s.find("items"); i != s.end()) {
      if (i->is_array()) fail("items", "tuple items (an array of schemas) are not supported");
      if (i->is_boolean() && !i->get<bool>()) {
        n.max_items = 0;
        n.items = any();
      } else {
        n.items = compile_at(*i, "items");
      }
    } else {
      n.items = any();
    }
    auto count = [&](const char* k) -> int64_t {
      const json& v = s.at(k);
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(k, fmt::format("{} must be >= 0", k));
      return v.get<int64_t>();
    };
    if (s.contains("minItems")) n.min_items = count("minItems");
    if (s.contains("maxItems")) n.max_items = count("maxItems");
    if (n.max_items >= 0 && n.min_items > n.max_items) fail("minItems", "minItems exceeds maxItems");
  }

  // The value trie of each enum/const set the root reaches (sets of alternatives merged away are not built),
  // and the true/false/null words of each node that allows them.
  void build_tries() {
    std::vector<int> built(sets_.size(), -1);
    std::map<uint8_t, uint32_t> words;  // by the boolean/null bits
    std::vector<bool> seen(out_.nodes_.size());
    std::vector<int> todo = {0};
    seen[0] = true;
    while (!todo.empty()) {
      const int i = todo.back();
      todo.pop_back();
      Node& n = out_.nodes_[size_t(i)];
      if (const int set = node_set_[size_t(i)]; set >= 0) {
        if (built[size_t(set)] < 0) {
          Tagged texts;
          for (const std::string& t : sets_[size_t(set)]) texts.emplace_back(t, 0);
          built[size_t(set)] = int(build_trie(out_.values_, std::move(texts), false));
        }
        n.values = uint32_t(built[size_t(set)]);
      } else if (const uint8_t w = n.types & (Node::kBoolean | Node::kNull)) {
        auto [at, fresh] = words.try_emplace(w, 0);
        if (fresh) {
          Tagged texts;
          if (w & Node::kBoolean) texts = {{"true", 0}, {"false", 0}};
          if (w & Node::kNull) texts.emplace_back("null", 0);
          at->second = build_trie(out_.values_, std::move(texts), false);
        }
        n.words = at->second;
      }
      auto visit = [&](int c) {
        if (c >= 0 && !seen[size_t(c)]) seen[size_t(c)] = true, todo.push_back(c);
      };
      for (int c : n.properties) visit(c);
      visit(n.additional);
      visit(n.items);
    }
  }

  // need_object / need_array: the least nesting a value of each node must have. Least fixed point, by
  // rounds: a round settles at least every node whose need is one more than the settled ones', and needs
  // past kMaxNesting are unbounded, so it takes at most kMaxNesting + 2 rounds.
  void compute_needs() {
    auto plus_one = [](uint8_t inner) {
      return inner == Node::kUnbounded || inner >= kMaxNesting ? Node::kUnbounded : uint8_t(inner + 1);
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = out_.nodes_.size(); i-- > 0;) {  // children come after their parents: mostly one round
        Node& n = out_.nodes_[i];
        uint8_t object = Node::kUnbounded, array = Node::kUnbounded;
        if (n.types & Node::kObject) {
          uint8_t inner = 0;
          for (size_t p = 0; p < n.properties.size(); ++p)
            if (n.required >> p & 1) inner = std::max(inner, out_.nodes_[size_t(n.properties[p])].need());
          object = plus_one(inner);
        }
        if (n.types & Node::kArray)
          array = plus_one(n.min_items > 0 ? out_.nodes_[size_t(n.items)].need() : 0);
        changed |= object != n.need_object || array != n.need_array;
        n.need_object = object, n.need_array = array;
      }
    }
  }

  JsonSchema& out_;
  const json& document_;
  const JsonSchemaLimits& limits_;
  std::vector<Segment> path_;
  std::map<std::string, int> refs_;             // target -> node
  std::vector<std::vector<std::string>> sets_;  // enum/const values, as JSON text
  std::vector<int> node_set_;                   // per node: its enum/const set, -1 if none
  size_t properties_ = 0, enum_values_ = 0, literal_bytes_ = 0;
  int any_ = -1;
};

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto s = std::make_shared<JsonSchema>();
  const json document = {{"type", "object"}};
  const JsonSchemaLimits limits;
  SchemaCompiler c(*s, document, limits);
  c.compile(document);
  c.finish();
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const json& schema, const JsonSchemaLimits& limits) {
  auto s = std::make_shared<JsonSchema>();
  SchemaCompiler c(*s, schema, limits);
  c.compile(schema);  // the root's node is the first one made: node 0
  c.finish();
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// The matcher.

using Frame = JsonMatcher::Frame;
static_assert(std::is_trivially_copyable_v<Frame>, "accepts() copies the stack once per token checked");

namespace {

// Object phases.
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNext };
// Array phases.
enum : uint8_t { kArrOpen, kArrItem, kArrAfter };
// String phases. A \u escape's value so far is in the frame's `seen`; `count` is 1 while a high surrogate
// waits for its low half.
enum : uint8_t { kStrChar, kStrEscape, kStrHex1, kStrHex2, kStrHex3, kStrHex4, kStrWantBackslash, kStrWantU };
// Number phases (accepting: kNumZero, kNumInt, kNumFrac, kNumExp).
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

bool number_accepting(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  Frame root;
  root.kind = Frame::kRoot;
  state_.stack.push_back(root);
  Frame value;
  value.kind = Frame::kValue;
  value.node = 0;
  state_.stack.push_back(value);
}

bool JsonMatcher::run(State& s, std::string_view bytes) const {
  s.stack.assign(state_.stack.begin(), state_.stack.end());  // reuses the capacity: no allocation
  s.whitespace_run = state_.whitespace_run;
  work_ += s.stack.size();
  for (char c : bytes)
    if (!feed(s, uint8_t(c))) return false;
  return true;
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  return run(scratch_, bytes);
}

bool JsonMatcher::advance(std::string_view bytes) {
  if (!run(scratch_, bytes)) return false;
  std::swap(state_, scratch_);
  return true;
}

bool JsonMatcher::can_end() const {
  const Frame& top = state_.stack.back();
  if (top.kind == Frame::kRoot) return true;
  if (state_.stack.size() != 2) return false;
  if (top.kind == Frame::kNumber) return number_accepting(top.phase);
  if (top.kind == Frame::kLiteral) return schema_->values().tag[top.trie] >= 0;
  return false;
}

// A value of `node` starting in the frame at `index` nests within kMaxNesting containers (the root frame
// holds none, so the frame at index i is inside i - 1).
bool JsonMatcher::fits(int node, size_t index) const {
  return index - 1 + schema_->node(node).need() <= size_t(kMaxNesting);
}

uint32_t JsonMatcher::step(const JsonTrie& trie, uint32_t node, uint8_t c) const {
  ++work_;
  return trie.child(node, c);
}

// An object opens in the frame at `index`: properties whose value would not fit below count as seen (none is
// required: the object's need covers those), and other keys may come only if their schema fits.
void JsonMatcher::open_object(Frame& f, size_t index) const {
  const Node& n = schema_->node(f.node);
  f.kind = Frame::kObject;
  f.phase = kObjOpen;
  f.seen = 0;
  work_ += n.properties.size();
  for (size_t p = 0; p < n.properties.size(); ++p)
    if (!fits(n.properties[p], index + 1)) f.seen |= uint64_t(1) << p;
  f.open = n.additional >= 0 && fits(n.additional, index + 1);
}

// The frame on top finished; tell its parent (now on top).
bool JsonMatcher::child_done(State& s) const {
  const Frame done = s.stack.back();
  s.stack.pop_back();
  Frame& f = s.stack.back();
  switch (f.kind) {
    case Frame::kRoot:
      f.phase = 1;
      return true;
    case Frame::kArray:
      ++f.count, f.phase = kArrAfter;
      return true;
    case Frame::kObject: {
      if (f.phase == kObjValue) {
        f.phase = kObjAfter;
        return true;
      }
      // A key: which property it names.
      const JsonTrie& names = schema_->names();
      if (done.kind == Frame::kName) {
        f.key_index = names.tag[done.trie];
      } else {
        const uint32_t end = done.trie == kNone ? kNone : names.child(done.trie, '"');
        f.key_index = end == kNone ? -1 : names.tag[end];
      }
      if (f.key_index >= 0) f.seen |= uint64_t(1) << f.key_index;
      f.phase = kObjColon;
      return true;
    }
    default:
      return false;
  }
}

bool JsonMatcher::feed(State& s, uint8_t c) const {
  ++work_;
  // Whitespace between tokens of JSON: accepted where `allowed`, at most kMaxWhitespaceRun in a row.
  auto whitespace = [&](bool allowed) {
    if (!allowed || !is_ws(c) || s.whitespace_run >= kMaxWhitespaceRun) return false;
    ++s.whitespace_run;
    return true;
  };
  for (;;) {
    Frame& f = s.stack.back();
    const size_t at = s.stack.size() - 1;  // f's index
    const Node& n = schema_->node(f.node);
    if (whitespace(f.kind == Frame::kRoot || f.kind == Frame::kValue || f.kind == Frame::kObject ||
                   f.kind == Frame::kArray))
      return true;
    if (!is_ws(c) || f.kind == Frame::kString) s.whitespace_run = 0;
    switch (f.kind) {
      case Frame::kRoot:
        return false;  // the value is complete; only whitespace may follow

      case Frame::kValue: {
        if (n.values != kNone || ((c == 't' || c == 'f' || c == 'n') && n.words != kNone)) {
          f.kind = Frame::kLiteral;
          f.trie = n.values != kNone ? n.values : n.words;
          continue;  // the literal takes this byte
        }
        // Containers only where what they must hold still fits.
        if (c == '{' && (n.types & Node::kObject) && at - 1 + n.need_object <= size_t(kMaxNesting)) {
          open_object(f, at);
          return true;
        }
        if (c == '[' && (n.types & Node::kArray) && at - 1 + n.need_array <= size_t(kMaxNesting)) {
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
        const JsonTrie& values = schema_->values();
        const uint32_t next = step(values, f.trie, c);
        if (next == kNone) {
          if (values.tag[f.trie] < 0 || !child_done(s)) return false;
          continue;  // the literal ended before this byte: the parent takes it
        }
        f.trie = next;
        // Done when no longer text is possible: tell the parent now.
        return values.leaf(next) ? child_done(s) : true;
      }

      case Frame::kName: {  // only properties not seen yet (nor too deep) may follow
        const JsonTrie& names = schema_->names();
        const uint32_t next = step(names, f.trie, c);
        if (next == kNone || !(names.below[next] & ~s.stack[at - 1].seen)) return false;
        f.trie = next;
        return names.leaf(next) ? child_done(s) : true;  // a name ends at its closing quote
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
        if (!number_accepting(f.phase) || !child_done(s)) return false;
        continue;
      }

      case Frame::kString: {
        // A key where other keys are allowed: its text so far is followed in the name trie.
        auto follow = [&] {
          if (f.key && f.trie != kNone) f.trie = step(schema_->names(), f.trie, c);
        };
        if (f.utf8_left) {  // inside a multi-byte UTF-8 character
          if (c < f.utf8_lo || c > f.utf8_hi) return false;
          --f.utf8_left;
          f.utf8_lo = 0x80, f.utf8_hi = 0xBF;
          follow();
          return true;
        }
        switch (f.phase) {
          case kStrChar:
            if (c == '"') {
              if (f.key) {  // the key must leave room for its value: a property too deep to start is refused
                const JsonTrie& names = schema_->names();
                const uint32_t end = f.trie == kNone ? kNone : names.child(f.trie, '"');
                const Node& object = schema_->node(s.stack[at - 1].node);
                if (end != kNone && names.tag[end] >= 0 &&
                    !fits(object.properties[size_t(names.tag[end])], at))
                  return false;
              }
              return child_done(s);
            }
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
        follow();
        return true;
      }

      case Frame::kObject: {
        const uint64_t all =
            n.properties.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.properties.size()) - 1;
        const bool more_keys = f.open || (f.seen & all) != all;
        const bool may_close = (f.seen & n.required) == n.required;
        auto start_key = [&] {
          Frame k;
          k.node = f.node;
          const uint32_t first = n.names == kNone ? kNone : schema_->names().child(n.names, '"');
          if (f.open) {
            k.kind = Frame::kString;
            k.key = true;
          } else {
            k.kind = Frame::kName;  // past the opening quote, which the object consumed
          }
          k.trie = first;
          f.phase = kObjKey;
          s.stack.push_back(k);
          return true;
        };
        switch (f.phase) {
          case kObjOpen:
            if (c == '"' && more_keys) return start_key();
            if (c == '}' && may_close) return child_done(s);
            return false;
          case kObjNext:
            return c == '"' && start_key();
          case kObjColon: {
            if (c != ':') return false;
            Frame v;
            v.node = f.key_index >= 0 ? n.properties[size_t(f.key_index)] : n.additional;
            f.phase = kObjValue;
            s.stack.push_back(v);
            return true;
          }
          case kObjAfter:
            if (c == ',' && more_keys) {
              f.phase = kObjNext;
              return true;
            }
            if (c == '}' && may_close) return child_done(s);
            return false;
          default:
            return false;
        }
      }

      case Frame::kArray: {
        const bool more = (n.max_items < 0 || f.count < n.max_items) && fits(n.items, at + 1);
        if (f.phase == kArrOpen || f.phase == kArrAfter) {
          if (c == ']' && f.count >= n.min_items) return child_done(s);
          const bool comma = f.phase == kArrAfter;
          if (!more || (comma && c != ',')) return false;
          Frame v;
          v.node = n.items;
          f.phase = kArrItem;
          s.stack.push_back(v);
          if (comma) return true;
          continue;  // the first item's first byte
        }
        return false;
      }
    }
  }
}

}  // namespace moeserve
