#include "engine/json_constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "common/parameter_type.h"

namespace moeserve {

using json = nlohmann::json;

using Node = JsonSchema::Node;

namespace {

constexpr size_t kMaxObjectProperties = 64;  // an object's property set is a 64-bit mask
constexpr uint32_t kNone = JsonTrie::kNone;

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
    case json::value_t::object:
      return Node::kObject;
    case json::value_t::array:
      return Node::kArray;
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

// A regular expression that matches exactly the given strings: each character escaped (letters, digits and
// non-ASCII stand for themselves), so its automaton is their trie.
std::string literal_alternation(const std::vector<std::string>& strings) {
  std::string pattern;
  for (const std::string& text : strings) {
    if (!pattern.empty()) pattern += '|';
    pattern += "(?:";
    for (char c : text) {
      if (uint8_t(c) < 0x80 && !std::isalnum(uint8_t(c))) pattern += '\\';
      pattern += c;
    }
    pattern += ')';
  }
  return pattern;
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
      : out_(out), document_(&document), limits_(limits) {}

  // Another document compiled into the same schema (a tool call's functions): its $refs are its own.
  void set_document(const json& document) {
    document_ = &document;
    refs_.clear();
  }

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
    if (s.contains("allOf")) return compile_at(all_of(s), "allOf");
    if (auto ref = s.find("$ref"); ref != s.end()) return reference(s, *ref);
    for (const char* keyword : {"anyOf", "oneOf"})
      if (s.contains(keyword)) return alternatives(s, keyword);
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kKnown = {"type",
                                                   "enum",
                                                   "const",
                                                   "properties",
                                                   "required",
                                                   "additionalProperties",
                                                   "items",
                                                   "minItems",
                                                   "maxItems",
                                                   "title",
                                                   "description",
                                                   "default",
                                                   "examples",
                                                   "$schema",
                                                   "$id",
                                                   "$comment",
                                                   "deprecated",
                                                   "readOnly",
                                                   "writeOnly",
                                                   "$defs",
                                                   "definitions",
                                                   "minimum",
                                                   "maximum",
                                                   "exclusiveMinimum",
                                                   "exclusiveMaximum",
                                                   "minLength",
                                                   "maxLength",
                                                   "pattern",
                                                   "format",
                                                   "prefixItems",
                                                   "propertyNames",
                                                   "additionalItems",
                                                   "multipleOf"};
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
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems") ||
               s.contains("prefixItems")) {
      n.types = Node::kArray;
    } else {
      n.types = Node::kAll;
    }
    if (n.types & Node::kNumber) n.types &= uint8_t(~Node::kInteger);  // number covers integer
    check_applies(s, n.types);
    const auto [multiple, scale] = multiple_of(s, n);
    if (n.types & (Node::kNumber | Node::kInteger)) number_bounds(s, n, multiple, scale);
    if (n.types & Node::kString) string_rule(s, n);
    if (s.contains("enum") || s.contains("const")) literals(s, n, index);
    if (n.types & Node::kObject) object(s, n);
    if (n.types & Node::kArray) array(s, n);
    out_.nodes_[size_t(index)] = std::move(n);
    return index;
  }

  // After compile(): the tries of what the roots reach, every node's need, and the checks that every
  // reference and the roots have a value that fits.
  void finish(const std::vector<int>& roots = {0}) {
    flatten_unions();
    for (const auto& [union_node, where] : one_of_) check_exclusive(union_node, where);
    build_tries(roots);
    compute_needs();
    for (const auto& [target, index] : refs_)
      if (out_.nodes_[size_t(index)].need() == Node::kUnbounded)
        throw SchemaError("$ref", brief(target),
                          fmt::format("'{}' has no value within {} levels of nesting: what it requires "
                                      "(required properties, minItems) contains itself without end, or nests "
                                      "deeper",
                                      brief(target), kMaxNesting));
    for (int root : roots)
      if (out_.nodes_[size_t(root)].need() == Node::kUnbounded)
        throw SchemaError(
            "max_nesting", "",
            fmt::format("every value of the schema nests more than {} containers deep", kMaxNesting));
  }

  // A function's arguments (the object node `root`, compiled from `parameters`) as Qwen3.5's XML parameters:
  // the trie of "<parameter=NAME>\n" and "</function>", and per property the node of its value as the tool
  // parser reads the text back (common/parameter_type.h): raw text for a string (its rule, or its enum's,
  // without '<', which would end the value), JSON of the one type the parser converts to otherwise.
  void xml_arguments(int root, const json& parameters) {
    Node& object = out_.nodes_[size_t(root)];
    if (!(object.types & Node::kObject) || object.values != kNone || !object.alternatives.empty())
      fail("parameters", "a function's parameters must be an object schema");
    if (object.properties.size() >= kMaxObjectProperties)
      fail("properties", fmt::format("at most {} parameters are supported", kMaxObjectProperties - 1));
    std::vector<std::string> entries;
    const json* listed = parameters.contains("properties") ? &parameters["properties"] : nullptr;
    size_t p = 0;
    if (listed)
      for (auto it = listed->begin(); it != listed->end(); ++it, ++p) {
        const std::string& name = it.key();
        Enter enter(path_, "properties." + brief(name));
        if (name.empty() || name.find_first_of("<>\n") != std::string::npos)
          fail("properties",
               fmt::format("the parameter name '{}' cannot be written as <parameter=NAME>", brief(name)));
        entries.push_back("<parameter=" + name + ">\n");
        const int value =
            xml_value(out_.nodes_[size_t(root)].properties[p], parameter_type(it.value(), parameters));
        out_.nodes_[size_t(root)].xml_values.push_back(value);
      }
    entries.push_back("</function>");
    Tagged tagged;
    for (size_t i = 0; i < entries.size(); ++i) tagged.emplace_back(entries[i], int8_t(i));
    out_.nodes_[size_t(root)].xml_names = build_trie(out_.names_, std::move(tagged), true);
  }

  // A function's name as the call writes it after its forced opening, and where its arguments start.
  static std::string call_name_text(const std::string& name, JsonSchema::CallFormat format) {
    if (format == JsonSchema::CallFormat::kQwenXml) return name + ">\n";
    return json(name).dump().substr(1) + ", \"arguments\": ";
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
  // Keywords that assert nothing: left out when allOf's parts merge.
  static bool annotation(const std::string& key) {
    static const std::set<std::string> kAnnotations = {"title",    "description", "default",     "examples",
                                                       "$comment", "$defs",       "definitions", "$schema",
                                                       "$id",      "deprecated",  "readOnly",    "writeOnly"};
    return kAnnotations.count(key) > 0;
  }

  // allOf as the one schema with the same meaning, where there is one: what pydantic writes (a single $ref
  // wrapped to carry a description or a default) and what zod writes for an intersection of objects. The
  // parent's own keywords are one more part. Parts whose keywords differ merge by their union (each keyword
  // asserts on its own; the types intersect); object parts merge by the object rule (merge_objects).
  // Anything else is a 400 naming allOf. The merged schema lives as long as the compiler.
  const json& all_of(const json& s) {
    const json& parts = s.at("allOf");
    if (!parts.is_array() || parts.empty()) fail("allOf", "allOf must be a non-empty array of schemas");
    std::vector<json> all;
    json own = s;
    own.erase("allOf");
    if (std::any_of(own.items().begin(), own.items().end(),
                    [](const auto& kv) { return !annotation(kv.key()); }))
      all.push_back(std::move(own));
    for (const json& part : parts) all.push_back(part);
    if (all.size() == 1) return merged_.emplace_back(std::move(all[0]));  // a $ref stays one: it may recurse
    if (++merges_ > limits_.max_nodes)
      fail("max_nodes", fmt::format("the schema's allOf merge more than {} times", limits_.max_nodes));
    for (json& part : all) part = resolved(part);
    const bool objects = std::any_of(all.begin(), all.end(), [](const json& p) {
      return p.contains("properties") || p.contains("required") || p.contains("additionalProperties") ||
             (p.contains("type") && p["type"] == "object");
    });
    return merged_.emplace_back(objects ? merge_objects(all) : merge_keywords(all));
  }

  // An allOf part as a schema object: a $ref's target (an allOf in it merged first), true as {}.
  json resolved(const json& part) {
    if (path_.size() > limits_.max_depth)
      fail("max_depth", fmt::format("the schema nests more than {} allOf and $ref deep", limits_.max_depth));
    if (part.is_boolean()) {
      if (!part.get<bool>()) fail("allOf", "a part of false admits no value");
      return json::object();
    }
    if (!part.is_object()) fail("allOf", "allOf's parts must be schemas");
    if (part.contains("allOf")) {
      Enter enter(path_, "allOf");
      return resolved(all_of(part));
    }
    const auto ref = part.find("$ref");
    if (ref == part.end()) return part;
    for (auto it = part.begin(); it != part.end(); ++it)
      if (it.key() != "$ref" && !annotation(it.key()))
        fail(it.key(), fmt::format("'{}' next to $ref is not supported", brief(it.key())));
    const std::string target = ref->is_string() ? ref->get<std::string>() : "";
    if (target.empty() || target[0] != '#')
      fail("$ref", "only local references ('#/$defs/Name') are supported");
    if (std::find(resolving_.begin(), resolving_.end(), target) != resolving_.end())
      fail("allOf", fmt::format("'{}' is a part of itself through allOf", brief(target)));
    const json* body = nullptr;
    try {
      const json::json_pointer ptr(target.substr(1));
      if (document_->contains(ptr)) body = &document_->at(ptr);
    } catch (const json::exception&) {
      fail("$ref", fmt::format("'{}' is not a JSON pointer", brief(target)));
    }
    if (!body) fail("$ref", fmt::format("'{}' points at nothing", brief(target)));
    resolving_.push_back(target);
    Enter enter(path_, brief(target), true);
    json out = resolved(*body);
    resolving_.pop_back();
    return out;
  }

  // Parts that assert with different keywords: their union, the types intersected. items and prefixItems
  // from different parts would change what items covers, so they must come from one part.
  json merge_keywords(const std::vector<json>& parts) {
    json out = json::object();
    std::optional<std::set<std::string>> types;
    std::map<std::string, size_t> from;  // keyword -> part
    for (size_t i = 0; i < parts.size(); ++i) {
      for (auto it = parts[i].begin(); it != parts[i].end(); ++it) {
        const std::string& k = it.key();
        if (annotation(k)) continue;
        if (k == "type") {
          std::set<std::string> these;
          for (const json& t : it->is_array() ? *it : json::array({*it}))
            if (t.is_string()) these.insert(t.get<std::string>());
          types = types ? intersect_types(*types, these) : these;
          continue;
        }
        if (from.emplace(k, i).second) {
          out[k] = *it;
        } else if (out[k] != *it) {
          out[k] = both(k, out[k], *it);
        }
      }
    }
    for (const char* k : {"prefixItems", "additionalItems"})
      if (from.count("items") && from.count(k) && from["items"] != from[k])
        fail("allOf", fmt::format("items and {} from different parts of allOf are not supported", k));
    if (types) {
      if (types->empty()) fail("allOf", "no type is allowed by every part of allOf");
      out["type"] = types->size() == 1 ? json(*types->begin()) : json(*types);
    }
    return out;
  }

  // One keyword that two parts of allOf both give, as the one value that asserts both: the tighter bound,
  // the values an enum shares with the other. Other keywords given twice (two patterns, two formats) stay
  // a 400.
  json both(const std::string& k, const json& a, const json& b) const {
    static const std::set<std::string> kLower = {"minimum", "exclusiveMinimum", "minLength", "minItems"};
    static const std::set<std::string> kUpper = {"maximum", "exclusiveMaximum", "maxLength", "maxItems"};
    if ((kLower.count(k) || kUpper.count(k)) && a.is_number() && b.is_number()) {
      const std::optional<Decimal> x = Decimal::parse(a.dump()), y = Decimal::parse(b.dump());
      if (x && y) return (compare(*x, *y) < 0) == (kLower.count(k) > 0) ? b : a;
    }
    if (k == "enum" && a.is_array() && b.is_array()) {
      json shared = json::array();
      for (const json& v : a)
        if (std::find(b.begin(), b.end(), v) != b.end()) shared.push_back(v);
      if (shared.empty()) fail("allOf", "no value is in the enum of every part of allOf");
      return shared;
    }
    fail("allOf", fmt::format("'{}' in more than one part of allOf, with different values, is not supported",
                              brief(k)));
  }

  static std::set<std::string> intersect_types(const std::set<std::string>& a,
                                               const std::set<std::string>& b) {
    std::set<std::string> out;
    for (const std::string& t : a)
      if (b.count(t)) out.insert(t);
    // number covers integer: integer and number are integer.
    if ((a.count("integer") && b.count("number")) || (a.count("number") && b.count("integer")))
      out.insert("integer");
    return out;
  }

  // Object parts (properties, required, additionalProperties true or false). A part is closed when its
  // additionalProperties is false, or absent beside properties (this matcher's default, see JsonSchema).
  // Merged: the keys every closed part lists (all keys when none is closed), each with every listing
  // part's schema (an allOf of them when several), the required of all parts, closed if any part is.
  json merge_objects(const std::vector<json>& parts) {
    static const std::set<std::string> kObjectKeywords = {"type", "properties", "required",
                                                          "additionalProperties"};
    std::vector<std::string> keys;                     // in order of first appearance
    std::map<std::string, std::vector<json>> schemas;  // key -> the listing parts' schemas
    std::optional<std::set<std::string>> allowed;      // the keys every closed part lists
    json required = json::array();
    for (size_t i = 0; i < parts.size(); ++i) {
      const json& p = parts[i];
      for (auto it = p.begin(); it != p.end(); ++it) {
        if (annotation(it.key())) continue;
        if (!kObjectKeywords.count(it.key()))
          fail("allOf",
               fmt::format("allOf merges object schemas (properties, required, additionalProperties); "
                           "part {} also has '{}'",
                           i, brief(it.key())));
      }
      if (p.contains("type") && p["type"] != "object")
        fail("allOf", fmt::format("allOf's part {} is not an object schema", i));
      const json* extra = p.contains("additionalProperties") ? &p["additionalProperties"] : nullptr;
      if (extra && !extra->is_boolean() && !(extra->is_object() && extra->empty()))
        fail("allOf", "additionalProperties schemas in allOf's parts are not supported (only true or false)");
      const json properties = p.value("properties", json::object());
      if (!properties.is_object()) fail("properties", "properties must be an object");
      const bool closed = extra ? *extra == false : p.contains("properties");
      std::set<std::string> listed;
      for (auto it = properties.begin(); it != properties.end(); ++it) {
        listed.insert(it.key());
        if (!schemas.count(it.key())) keys.push_back(it.key());
        schemas[it.key()].push_back(it.value());
      }
      if (closed) {
        if (allowed) {
          std::set<std::string> both;
          for (const std::string& k : *allowed)
            if (listed.count(k)) both.insert(k);
          allowed = std::move(both);
        } else {
          allowed = std::move(listed);
        }
      }
      if (auto r = p.find("required"); r != p.end()) {
        if (!r->is_array()) fail("required", "required must be an array of property names");
        for (const json& name : *r)
          if (std::find(required.begin(), required.end(), name) == required.end()) required.push_back(name);
      }
    }
    json properties = json::object();
    for (const std::string& k : keys) {
      if (allowed && !allowed->count(k)) continue;
      std::vector<json>& these = schemas[k];
      properties[k] = these.size() == 1 ? these[0] : json{{"allOf", these}};
    }
    for (const json& name : required)
      if (name.is_string() && allowed && !allowed->count(name.get<std::string>()))
        fail("allOf", fmt::format("'{}' is required, but a part of allOf closes the object without it "
                                  "(additionalProperties false, or properties without it), so no object "
                                  "passes every part",
                                  brief(name.get<std::string>())));
    return {{"type", "object"},
            {"properties", std::move(properties)},
            {"required", std::move(required)},
            {"additionalProperties", !allowed.has_value()}};
  }

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
      if (document_->contains(ptr)) body = &document_->at(ptr);
    } catch (const json::exception&) {
      fail("$ref", fmt::format("'{}' is not a JSON pointer", brief(target)));
    }
    if (!body) fail("$ref", fmt::format("'{}' points at nothing", brief(target)));
    // Reserve the node first so that a recursive schema refers to itself.
    const int index = add();
    refs_[target] = index;
    const int compiled = compile_at(*body, brief(target), true);
    if (in_progress(compiled)) {
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

  // A node reserved for a $ref target still being compiled (an enclosing one): nothing is known of it yet.
  bool in_progress(int index) const {
    const Node& n = out_.nodes_[size_t(index)];
    return n.types == 0 && n.alternatives.empty();
  }

  // anyOf / oneOf. Alternatives that start differently (Optional[X] is X or null) are merged into one node,
  // the first byte of a value picking the alternative, when that node is exact: see merge(). Others (two
  // objects, as pydantic's unions and zod's z.union write them; a bounded integer and a number; an
  // alternative that refers to an enclosing schema) are a union node, whose alternatives the matcher
  // follows at once. A oneOf must moreover never let a value match two alternatives: check_exclusive().
  int alternatives(const json& s, const char* keyword) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      static const std::set<std::string> kAnnotations = {
          "anyOf",    "oneOf", "title",       "description",  "default", "examples",
          "$comment", "$defs", "definitions", "discriminator"};  // OpenAPI's hint (pydantic writes it): the
                                                                 // alternatives' consts say the same
      if (!kAnnotations.count(it.key()))
        fail(it.key(), fmt::format("'{}' next to {} is not supported", brief(it.key()), keyword));
    }
    const json& alts = s.at(keyword);
    if (!alts.is_array() || alts.empty()) fail(keyword, fmt::format("{} must be a non-empty array", keyword));
    const int index = add();
    std::vector<int> compiled;
    for (size_t i = 0; i < alts.size(); ++i)
      compiled.push_back(compile_at(alts[i], fmt::format("{}[{}]", keyword, i)));
    const bool one_of = std::string_view(keyword) == "oneOf";
    Node merged;
    int merged_set = -1;
    if (merge(compiled, one_of, merged, merged_set)) {
      out_.nodes_[size_t(index)] = std::move(merged);
      node_set_[size_t(index)] = merged_set;
      return index;
    }
    Node u;
    u.alternatives = compiled;
    for (int alt : compiled) u.types |= out_.nodes_[size_t(alt)].types;  // finish() completes it
    out_.nodes_[size_t(index)] = std::move(u);
    if (one_of) one_of_.emplace_back(index, path());
    return index;
  }

  // The alternatives as one node, when it holds their union exactly: no two start alike, except as
  // merge_same_class() allows (a oneOf: none), and enum/const alternatives only with each other (one set of
  // values; a oneOf's sets might share a value). False: they need a union node.
  bool merge(const std::vector<int>& alts, bool one_of, Node& merged, int& merged_set) {
    uint8_t classes = 0;  // integer and number are one class: both start with a digit
    for (size_t i = 0; i < alts.size(); ++i) {
      const Node& n = out_.nodes_[size_t(alts[i])];
      if (in_progress(alts[i]) || !n.alternatives.empty()) return false;
      if (const int set = node_set_[size_t(alts[i])]; set >= 0) {  // enum/const: all the values in one trie
        if (one_of || (i > 0 && merged_set < 0)) return false;
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
      if (merged_set >= 0) return false;
      const uint8_t cls = n.types & (Node::kNumber | Node::kInteger)
                              ? uint8_t(n.types | Node::kNumber | Node::kInteger)
                              : n.types;
      const uint8_t overlap = classes & cls;
      if ((one_of && overlap) || !merge_same_class(merged, n, overlap)) return false;
      classes |= cls;
      const uint8_t fresh = n.types & uint8_t(~overlap);  // what merge_same_class did not take
      merged.types |= fresh;
      if (fresh & Node::kObject) {
        merged.names = n.names, merged.properties = n.properties;
        merged.required = n.required, merged.additional = n.additional;
      }
      if (fresh & Node::kArray) {
        merged.items = n.items, merged.min_items = n.min_items, merged.max_items = n.max_items;
        merged.prefix_items = n.prefix_items;
      }
      if (fresh & (Node::kNumber | Node::kInteger)) merged.bounds = n.bounds;
      if (fresh & Node::kString) merged.string_rule = n.string_rule;
    }
    return true;
  }

  // Each union node's alternatives as the nodes they come to once unions inside unions are opened (the
  // matcher forks once per value), and their types. A union among its own alternatives has no value.
  void flatten_unions() {
    std::vector<int> on_path;
    std::function<void(int, std::vector<int>&)> open = [&](int u, std::vector<int>& flat) {
      if (std::find(on_path.begin(), on_path.end(), u) != on_path.end())
        throw SchemaError("anyOf", "",
                          "an anyOf/oneOf is one of its own alternatives (through $ref): it has no value");
      on_path.push_back(u);
      for (int alt : out_.nodes_[size_t(u)].alternatives) {
        if (!out_.nodes_[size_t(alt)].alternatives.empty())
          open(alt, flat);
        else if (std::find(flat.begin(), flat.end(), alt) == flat.end())
          flat.push_back(alt);
      }
      on_path.pop_back();
    };
    for (size_t i = 0; i < out_.nodes_.size(); ++i) {
      if (out_.nodes_[i].alternatives.empty()) continue;
      std::vector<int> flat;
      open(int(i), flat);
      uint8_t types = 0;
      for (int alt : flat) types |= out_.nodes_[size_t(alt)].types;
      out_.nodes_[i].alternatives = std::move(flat);
      out_.nodes_[i].types = types;
    }
  }

  // A oneOf's union node: no value may match two of its alternatives. Proved pairwise by exclusive(), which
  // knows the cases that unions of models have (different types, const discriminators, a required property
  // the other does not allow); a oneOf it cannot prove is refused (anyOf is the same without the check).
  void check_exclusive(int union_node, const std::string& where) const {
    const std::vector<int>& alts = out_.nodes_[size_t(union_node)].alternatives;
    for (size_t i = 0; i < alts.size(); ++i)
      for (size_t j = i + 1; j < alts.size(); ++j)
        if (!exclusive(alts[i], alts[j], 0)) {
          const std::string msg =
              "oneOf alternatives that one value may match both are not supported (give each a property "
              "with a different const, as a discriminated union does, or use anyOf)";
          throw SchemaError("oneOf", where, where.empty() ? msg : fmt::format("{} (at {})", msg, where));
        }
  }

  // The classes of first byte the values of a node start with (integer folded into number).
  uint8_t starts(int index) const {
    const Node& n = out_.nodes_[size_t(index)];
    const int set = node_set_[size_t(index)];
    if (set < 0 || !n.alternatives.empty())
      return n.types & Node::kInteger ? uint8_t((n.types & ~Node::kInteger) | Node::kNumber) : n.types;
    uint8_t classes = 0;
    for (const std::string& text : sets_[size_t(set)]) {
      const char c = text[0];
      classes |= c == '{'               ? Node::kObject
                 : c == '['             ? Node::kArray
                 : c == '"'             ? Node::kString
                 : c == 't' || c == 'f' ? Node::kBoolean
                 : c == 'n'             ? Node::kNull
                                        : Node::kNumber;
    }
    return classes;
  }

  // No value matches both nodes (false: not proved).
  bool exclusive(int a, int b, int depth) const {
    if (depth > 8) return false;
    if (!(starts(a) & starts(b))) return true;
    for (const auto& [u, v] : {std::pair{a, b}, std::pair{b, a}}) {
      const std::vector<int>& alts = out_.nodes_[size_t(u)].alternatives;
      const int other = v;  // a named copy: clang 14 does not capture structured bindings
      if (!alts.empty())
        return std::all_of(alts.begin(), alts.end(),
                           [&](int alt) { return exclusive(alt, other, depth + 1); });
    }
    const int set_a = node_set_[size_t(a)], set_b = node_set_[size_t(b)];
    if (set_a >= 0 && set_b >= 0) {  // no value in common (numbers by value: 1 and 1.0 are one)
      std::set<std::string> seen;
      auto key = [](const std::string& text) {
        const std::optional<Decimal> d = Decimal::parse(text);
        return d ? fmt::format("{}{}e{}", d->negative ? "-" : "", d->digits, d->exponent) : text;
      };
      for (const std::string& t : sets_[size_t(set_a)]) seen.insert(key(t));
      for (const std::string& t : sets_[size_t(set_b)])
        if (seen.count(key(t))) return false;
      return true;
    }
    const Node &x = out_.nodes_[size_t(a)], &y = out_.nodes_[size_t(b)];
    if (set_a >= 0 || set_b >= 0 || x.types != Node::kObject || y.types != Node::kObject) return false;
    // Two objects: a property one requires that the other does not allow, or that both require with values
    // that exclude each other.
    const std::vector<std::string>&xs = listed(x), &ys = listed(y);
    for (auto [p, q, ps, qs] : {std::tuple{&x, &y, &xs, &ys}, std::tuple{&y, &x, &ys, &xs}})
      for (size_t i = 0; i < ps->size(); ++i) {
        if (!(p->required >> i & 1)) continue;
        const auto at = std::find(qs->begin(), qs->end(), (*ps)[i]);
        if (at == qs->end()) {
          if (q->additional < 0) return true;
          continue;
        }
        const size_t k = size_t(at - qs->begin());
        if ((q->required >> k & 1) && exclusive(p->properties[i], q->properties[k], depth + 1)) return true;
      }
    return false;
  }

  // An object node's property names (JSON text), in the order of its properties.
  const std::vector<std::string>& listed(const Node& n) const {
    static const std::vector<std::string> kEmpty;
    const auto it = listed_.find(n.names);
    return it == listed_.end() ? kEmpty : it->second;
  }

  int xml_value(int property, const ParameterType& wire) {
    const Node n = out_.nodes_[size_t(property)];
    const uint8_t nullable = wire.nullable ? (n.types & Node::kNull) : 0;
    Node v;
    if (wire.type.empty() || wire.type == "string") {
      // The text stays a string ("null" is null only where the schema says nullable, and then allowed).
      if (!(n.types & Node::kString) || (wire.type.empty() && (n.types | Node::kInteger) != Node::kAll))
        fail("type",
             "the qwen3_coder format writes this parameter as text, which its schema does not allow "
             "(give it a type)");
      std::shared_ptr<const RegexDfa> dfa;
      int64_t min = 0, max = -1;
      if (const int set = node_set_[size_t(property)]; set >= 0) {
        std::vector<std::string> strings;
        size_t bytes = 0;
        for (const std::string& text : sets_[size_t(set)])
          if (const json value = json::parse(text); value.is_string()) {
            strings.push_back(value.get<std::string>());
            bytes += strings.back().size();
          }
        if (strings.empty()) fail("enum", "no value of the enum/const is a string");
        dfa = RegexDfa::compile(literal_alternation(strings), false, bytes + 2);
      } else if (n.string_rule >= 0) {
        const StringRule& rule = out_.strings_[size_t(n.string_rule)];
        dfa = rule.automaton(), min = rule.min_length(), max = rule.max_length();
      }
      static const auto no_angle = RegexDfa::compile("[^<]*", false);
      dfa = dfa ? RegexDfa::intersect(*dfa, *no_angle, false, limits_.max_pattern_states * 16) : no_angle;
      try {
        out_.strings_.emplace_back(dfa, min, max);
      } catch (const Error& e) {
        fail("maxLength", e.what());
      }
      const StringRule& rule = out_.strings_.back();
      if (!rule.viable(rule.start(), 0))
        fail("pattern",
             "no string without '<' passes this parameter's schema (the qwen3_coder format ends a "
             "value at '<')");
      v.types = Node::kString;
      v.string_rule = int(out_.strings_.size()) - 1;
      v.raw = true;
    } else {
      static const std::map<std::string, uint8_t> kTypes = {{"integer", Node::kInteger},
                                                            {"number", Node::kNumber},
                                                            {"boolean", Node::kBoolean},
                                                            {"object", Node::kObject},
                                                            {"array", Node::kArray}};
      auto t = kTypes.find(wire.type);
      const uint8_t want = t == kTypes.end() ? 0 : t->second;
      const uint8_t has = want & (Node::kInteger | Node::kNumber) ? Node::kInteger | Node::kNumber : want;
      if (!(n.types & has))
        fail("type",
             fmt::format("the qwen3_coder format reads this parameter as {}, which its schema does not "
                         "allow",
                         wire.type.empty() ? "text" : wire.type));
      v = n;
      if (!n.alternatives.empty()) {
        // A union is kept whole when every value it allows reads back as itself: all of the one type.
        if (union_types(property) & ~(want | nullable))
          fail("type", fmt::format("the qwen3_coder format reads this parameter as {}, and its anyOf/oneOf "
                                   "allows other types too",
                                   wire.type.empty() ? "text" : wire.type));
      } else {
        // A number schema that only integers pass (multipleOf) stays one: the text reads as the same number.
        const bool integers = want == Node::kNumber && !(n.types & Node::kNumber);
        v.types = uint8_t((integers ? int(Node::kInteger) : want) | nullable);
      }
    }
    const int index = add();
    node_set_[size_t(index)] = v.raw ? -1 : node_set_[size_t(property)];
    out_.nodes_[size_t(index)] = std::move(v);
    return index;
  }

  // The types of a union node's values, through the unions among its alternatives (before finish()).
  uint8_t union_types(int index) const {
    std::vector<int> todo = {index}, seen;
    uint8_t types = 0;
    while (!todo.empty()) {
      const int i = todo.back();
      todo.pop_back();
      if (std::find(seen.begin(), seen.end(), i) != seen.end()) continue;
      seen.push_back(i);
      const Node& n = out_.nodes_[size_t(i)];
      if (n.alternatives.empty()) types |= n.types;
      todo.insert(todo.end(), n.alternatives.begin(), n.alternatives.end());
    }
    return types;
  }

  // A later alternative `n` of anyOf overlaps `merged` in the classes `overlap` (types that start alike). One
  // node still holds their union exactly when the overlap is only: null or boolean (the same values);
  // strings with the same lengths, whose automata are then united; an integer and a number without bounds
  // (the number covers it). Containers never: the matcher would have to follow both.
  bool merge_same_class(Node& merged, const Node& n, uint8_t overlap) {
    if (!overlap) return true;
    if (overlap & (Node::kObject | Node::kArray)) return false;
    if (overlap & Node::kNumber) {
      const bool m_open = (merged.types & Node::kNumber) && merged.bounds < 0;
      const bool n_open = (n.types & Node::kNumber) && n.bounds < 0;
      const bool same_integers =
          !(merged.types & Node::kNumber) && !(n.types & Node::kNumber) && merged.bounds < 0 && n.bounds < 0;
      if (!m_open && !n_open && !same_integers) return false;
      if (!same_integers) {
        merged.types = uint8_t((merged.types & ~Node::kInteger) | Node::kNumber);
        merged.bounds = -1;
      }
    }
    if (overlap & Node::kString) {
      if (merged.string_rule < 0 || n.string_rule < 0) {
        merged.string_rule = -1;  // one of them is any string
      } else if (merged.string_rule != n.string_rule) {
        const StringRule& a = out_.strings_[size_t(merged.string_rule)];
        const StringRule& b = out_.strings_[size_t(n.string_rule)];
        if (a.min_length() != b.min_length() || a.max_length() != b.max_length()) return false;
        std::shared_ptr<const RegexDfa> both;
        if (a.automaton() && b.automaton()) {
          // A or B = all but (all but A, but B): the automata offer intersection and difference.
          static const auto all = RegexDfa::compile("[\\s\\S]*", false);
          const size_t room = limits_.max_pattern_states * 16;
          try {
            const auto not_a = RegexDfa::intersect(*all, *a.automaton(), true, room);
            both = RegexDfa::intersect(*all, *RegexDfa::intersect(*not_a, *b.automaton(), true, room), true,
                                       room);
          } catch (const Error& e) {
            fail("pattern", e.what());
          }
        }
        out_.strings_.emplace_back(both, a.min_length(), a.max_length());
        merged.string_rule = int(out_.strings_.size()) - 1;
      }
    }
    return true;
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
    // Values the rest of the schema refuses (a string its pattern does not match, a number out of bounds)
    // are left out: the document must pass every keyword.
    auto passes = [&](const json& v) {
      if (v.is_string() && n.string_rule >= 0) return string_passes(out_.strings_[size_t(n.string_rule)], v);
      if (v.is_number() && n.bounds >= 0)
        return out_.bounds_[size_t(n.bounds)].contains(*Decimal::parse(v.dump()));
      return true;
    };
    auto take = [&](const json& v) {
      const uint8_t t = literal_type(v);
      if (!t) fail(keyword, "a value of enum/const is not JSON");
      // An object or array value is matched as its canonical text; the schema's own container keywords
      // would have to be checked on it, which is not done.
      for (const char* k :
           {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems"})
        if ((t & (Node::kObject | Node::kArray)) && s.contains(k))
          fail(keyword,
               fmt::format("an object or array in {} together with '{}' is not supported", keyword, k));
      if ((t & n.types) && passes(v)) set.push_back(text_of(v, keyword));
    };
    if (values) {
      for (const json& v : *values) take(v);
    } else {
      take(*one);
    }
    if (set.empty())
      fail(keyword, "no value of the enum/const has the schema's type and passes its other keywords");
    node_set_[size_t(index)] = int(sets_.size());
    sets_.push_back(std::move(set));
  }

  void check_applies(const json& s, uint8_t types) const {
    for (const char* k : {"properties", "required", "additionalProperties", "propertyNames"})
      if (s.contains(k) && !(types & Node::kObject)) fail(k, fmt::format("'{}' needs type object", k));
    for (const char* k : {"items", "minItems", "maxItems", "prefixItems", "additionalItems"})
      if (s.contains(k) && !(types & Node::kArray)) fail(k, fmt::format("'{}' needs type array", k));
    for (const char* k : {"minLength", "maxLength", "pattern", "format"})
      if (s.contains(k) && !(types & Node::kString)) fail(k, fmt::format("'{}' needs type string", k));
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
      if (s.contains(k) && !(types & (Node::kNumber | Node::kInteger)))
        fail(k, fmt::format("'{}' needs type number or integer", k));
  }

  // minLength/maxLength (code points, as JSON Schema counts), and a pattern (ECMAScript, matched anywhere in
  // the string) or a format. Rules are shared by the nodes that ask the same.
  void string_rule(const json& s, Node& n) {
    auto length = [&](const char* k) -> int64_t {
      const json& v = s.at(k);
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        fail(k, fmt::format("{} must be an integer >= 0", k));
      return v.get<int64_t>();
    };
    const int64_t min = s.contains("minLength") ? length("minLength") : 0;
    const int64_t max = s.contains("maxLength") ? length("maxLength") : -1;
    const json* pattern = s.contains("pattern") ? &s.at("pattern") : nullptr;
    const json* format = s.contains("format") ? &s.at("format") : nullptr;
    if (!pattern && !format && min == 0 && max < 0) return;
    if (max >= 0 && min > max) fail("minLength", "minLength exceeds maxLength");
    std::shared_ptr<const RegexDfa> dfa;
    std::string key = fmt::format("{} {} ", min, max);
    if (format) {  // zod 4 writes a format together with a pattern: the string must pass both
      const std::string name = format->is_string() ? format->get<std::string>() : "";
      key += "f" + name + " ";
      dfa = format_automaton(name);
      if (!dfa)
        fail("format",
             fmt::format("'format' {} is not supported (date-time, date, time, uuid, email, uri, ipv4 are)",
                         describe(*format)));
    }
    if (pattern) {
      if (!pattern->is_string()) fail("pattern", "pattern must be a string");
      const std::string& text = pattern->get_ref<const std::string&>();
      key += "p" + text;
      try {
        auto own = RegexDfa::compile(text, true, limits_.max_pattern_states);
        dfa = dfa ? RegexDfa::intersect(*dfa, *own, false, limits_.max_pattern_states * 16) : own;
      } catch (const Error& e) {
        fail("pattern", fmt::format("pattern '{}': {}", brief(text), e.what()));
      }
    }
    if (auto it = rules_.find(key); it != rules_.end()) {
      n.string_rule = it->second;
      return;
    }
    try {
      out_.strings_.emplace_back(dfa, min, max);
    } catch (const Error& e) {
      fail(max >= 0 ? "maxLength" : "minLength", e.what());
    }
    n.string_rule = int(out_.strings_.size()) - 1;
    rules_.emplace(std::move(key), n.string_rule);
    const StringRule& rule = out_.strings_.back();
    if (!rule.viable(rule.start(), 0))
      fail(pattern  ? "pattern"
           : format ? "format"
                    : "minLength",
           "no string passes this schema's pattern/format together with its minLength/maxLength");
  }

  // Whether a string value (an enum/const) passes a rule: its code points through the automaton.
  static bool string_passes(const StringRule& rule, const json& v) {
    const std::string& text = v.get_ref<const std::string&>();
    uint32_t state = rule.start();
    int64_t length = 0;
    for (size_t i = 0; i < text.size(); ++length) {
      const uint8_t c = uint8_t(text[i]);
      const int extra = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
      uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
      for (int k = 1; k <= extra && i + size_t(k) < text.size(); ++k)
        cp = cp << 6 | (uint8_t(text[i + size_t(k)]) & 0x3F);
      i += size_t(extra) + 1;
      state = rule.next(state, cp);
      if (state == RegexDfa::kDead) return false;
    }
    return rule.complete(state, length);
  }

  // minimum/maximum and exclusiveMinimum/exclusiveMaximum, as numbers (draft 6 on) or as booleans that make
  // minimum/maximum exclusive (draft 4, OpenAPI 3.0); when both kinds bound one end the tighter one holds.
  void number_bounds(const json& s, Node& n, int64_t multiple, int scale) {
    struct End {
      std::optional<Decimal> at;
      bool open = false;
    };
    auto value = [&](const char* k) {
      const json& v = s.at(k);
      std::optional<Decimal> d = v.is_number() ? Decimal::parse(v.dump()) : std::nullopt;
      if (!d) fail(k, fmt::format("{} must be a number", k));
      return *d;
    };
    auto end = [&](const char* inclusive, const char* exclusive, int tighter) {
      End e;
      if (s.contains(inclusive)) e.at = value(inclusive);
      if (auto x = s.find(exclusive); x != s.end()) {
        if (x->is_boolean()) {
          if (x->get<bool>() && !e.at)
            fail(exclusive, fmt::format("{}: true needs {}", exclusive, inclusive));
          e.open = x->get<bool>();
        } else if (const Decimal d = value(exclusive); !e.at || compare(d, *e.at) * tighter >= 0) {
          e.at = d, e.open = true;
        }
      }
      return e;
    };
    const End lo = end("minimum", "exclusiveMinimum", 1), hi = end("maximum", "exclusiveMaximum", -1);
    if (!lo.at && !hi.at && !multiple) return;
    const bool integer = !(n.types & Node::kNumber);
    NumberBounds b = NumberBounds::make(lo.at, lo.open, hi.at, hi.open, integer);
    b.multiple = multiple;
    b.scale = scale;
    if (b.empty())
      fail(multiple ? "multipleOf"
           : lo.at  ? "minimum"
                    : "maximum",
           fmt::format("no {} is within the schema's minimum and maximum", multiple ? "multiple of multipleOf"
                                                                           : integer ? "integer"
                                                                                     : "number"));
    n.bounds = int(out_.bounds_.size());
    out_.bounds_.push_back(std::move(b));
  }

  // multipleOf as multiple * 10^-scale (multiple 0: none), read exactly from the schema's text (0.01 is
  // 1 * 10^-2). A whole step makes a number schema an integer one (5.0 and 5 are one value; the integer
  // spelling is written); on an integer schema a fractional step is the whole step its integer multiples
  // share (0.5 -> 1, 0.3 -> 3); a number schema keeps a fractional one (json_number.h).
  std::pair<int64_t, int> multiple_of(const json& s, Node& n) {
    const auto it = s.find("multipleOf");
    if (it == s.end()) return {0, 0};
    const std::optional<Decimal> step = it->is_number() ? Decimal::parse(it->dump()) : std::nullopt;
    if (!step || step->zero() || step->negative) fail("multipleOf", "multipleOf must be a number > 0");
    const int64_t decimals = std::max<int64_t>(0, int64_t(step->digits.size()) - step->exponent);
    if (decimals > NumberBounds::kMaxStepScale)
      fail("multipleOf", fmt::format("multipleOf is supported with at most {} decimals (not {})",
                                     NumberBounds::kMaxStepScale, it->dump()));
    const int scale = int(decimals);
    const int64_t limit = scale == 0 ? NumberBounds::kMaxStepMagnitude : NumberBounds::kMaxFractionUnits;
    int64_t units = 0;  // the step in units of 10^-scale
    for (int64_t k = 0; k < step->exponent + scale; ++k) {
      const int digit = k < int64_t(step->digits.size()) ? step->digits[size_t(k)] - '0' : 0;
      if (units > (limit - digit) / 10)
        fail("multipleOf", fmt::format("multipleOf {} is over the largest supported, {}", it->dump(),
                                       scale == 0 ? fmt::format("{}", limit)
                                                  : fmt::format("{} units of 10^-{}", limit, scale)));
      units = units * 10 + digit;
    }
    if (scale > 0 && !(n.types & Node::kNumber)) {
      // Integers v with v * 10^scale divisible by units: the multiples of units / gcd(units, 10^scale).
      int64_t power = 1;
      for (int k = 0; k < scale; ++k) power *= 10;
      return {units / std::gcd(units, power), 0};
    }
    if (scale == 0 && (n.types & Node::kNumber))
      n.types = uint8_t((n.types & ~Node::kNumber) | Node::kInteger);
    return {units, scale};
  }

  void object(const json& s, Node& n) {
    // Keys are strings whatever propertyNames says; only that much of it (zod's records write it) is taken.
    if (auto names = s.find("propertyNames"); names != s.end()) {
      const bool plain = names->is_boolean()
                             ? names->get<bool>()
                             : names->is_object() && (names->empty() || *names == json{{"type", "string"}});
      if (!plain) fail("propertyNames", "propertyNames other than {\"type\": \"string\"} is not supported");
    }
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
      if (!names.empty()) {
        n.names = build_trie(out_.names_, std::move(names), true);
        listed_[n.names] = std::move(texts);
      }
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
    // prefixItems (2020-12), or items as an array of schemas (draft 7, zod-to-json-schema's tuples) with
    // additionalItems for the rest.
    const json* prefix = s.contains("prefixItems") ? &s.at("prefixItems") : nullptr;
    const json* rest = s.contains("items") ? &s.at("items") : nullptr;
    if (rest && rest->is_array()) {
      if (prefix) fail("items", "items as an array together with prefixItems");
      prefix = rest;
      rest = s.contains("additionalItems") ? &s.at("additionalItems") : nullptr;
    } else if (s.contains("additionalItems")) {
      fail("additionalItems", "additionalItems needs items as an array");
    }
    if (prefix) {
      if (!prefix->is_array()) fail("prefixItems", "prefixItems must be an array of schemas");
      for (size_t i = 0; i < prefix->size(); ++i)
        n.prefix_items.push_back(compile_at((*prefix)[i], fmt::format("prefixItems[{}]", i)));
    }
    if (rest && rest->is_boolean() && !rest->get<bool>()) {
      n.max_items = int64_t(n.prefix_items.size());
      n.items = any();
    } else {
      n.items = rest ? compile_at(*rest, "items") : any();
    }
    auto count = [&](const char* k) -> int64_t {
      const json& v = s.at(k);
      if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(k, fmt::format("{} must be >= 0", k));
      return v.get<int64_t>();
    };
    if (s.contains("minItems")) n.min_items = count("minItems");
    if (s.contains("maxItems"))
      n.max_items = n.max_items >= 0 ? std::min(n.max_items, count("maxItems")) : count("maxItems");
    if (n.max_items >= 0 && n.min_items > n.max_items) fail("minItems", "minItems exceeds the items allowed");
  }

  // The value trie of each enum/const set the root reaches (sets of alternatives merged away are not built),
  // and the true/false/null words of each node that allows them.
  void build_tries(const std::vector<int>& roots) {
    std::vector<int> built(sets_.size(), -1);
    std::map<uint8_t, uint32_t> words;  // by the boolean/null bits
    std::vector<bool> seen(out_.nodes_.size());
    std::vector<int> todo = roots;
    for (int root : roots) seen[size_t(root)] = true;
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
      for (int c : n.prefix_items) visit(c);
      for (int c : n.xml_values) visit(c);
      for (int c : n.alternatives) visit(c);
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
        if (!n.alternatives.empty()) {  // a union: its least alternative's
          for (int alt : n.alternatives) object = std::min(object, out_.nodes_[size_t(alt)].need());
          array = object;
        } else {
          if (n.types & Node::kObject) {
            uint8_t inner = 0;
            for (size_t p = 0; p < n.properties.size(); ++p)
              if (n.required >> p & 1) inner = std::max(inner, out_.nodes_[size_t(n.properties[p])].need());
            object = plus_one(inner);
          }
          if (n.types & Node::kArray) {
            uint8_t inner = 0;  // the items it must have
            for (int64_t k = 0; k < n.min_items && k <= int64_t(n.prefix_items.size()); ++k)
              inner = std::max(inner, out_.nodes_[size_t(out_.item(n, k))].need());
            array = plus_one(inner);
          }
        }
        changed |= object != n.need_object || array != n.need_array;
        n.need_object = object, n.need_array = array;
      }
    }
  }

  JsonSchema& out_;
  const json* document_;
  const JsonSchemaLimits& limits_;
  std::vector<Segment> path_;
  std::map<std::string, int> refs_;  // target -> node
  std::deque<json> merged_;          // allOf's merged schemas, compiled in place
  size_t merges_ = 0;
  std::vector<std::string> resolving_;                   // the $refs an allOf part is being resolved through
  std::vector<std::pair<int, std::string>> one_of_;      // oneOf union nodes, and where they are
  std::map<uint32_t, std::vector<std::string>> listed_;  // an object's name trie -> its property names
  std::map<std::string, int> rules_;                     // a string rule's keywords -> its index
  std::vector<std::vector<std::string>> sets_;           // enum/const values, as JSON text
  std::vector<int> node_set_;                            // per node: its enum/const set, -1 if none
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

std::shared_ptr<const JsonSchema> JsonSchema::regex(std::string_view pattern,
                                                    const JsonSchemaLimits& limits) {
  auto s = std::make_shared<JsonSchema>();
  try {
    s->strings_.emplace_back(RegexDfa::compile(pattern, false, limits.max_pattern_states), 0, -1);
  } catch (const Error& e) {
    throw SchemaError("regex", "", fmt::format("regex: {}", e.what()));
  }
  if (!s->strings_[0].viable(s->strings_[0].start(), 0))
    throw SchemaError("regex", "", "regex: no text matches it");
  Node root;
  root.types = Node::kString;
  root.string_rule = 0;
  s->nodes_.push_back(root);
  s->raw_text_ = true;
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::tool_call(const std::vector<Function>& functions,
                                                        CallFormat format, bool name_written,
                                                        const JsonSchemaLimits& limits) {
  if (functions.empty() || functions.size() > 127 || (name_written && functions.size() != 1))
    throw SchemaError("tools", "", "a forced tool call is constrained over 1 to 127 functions");
  auto s = std::make_shared<JsonSchema>();
  const json empty = json::object();
  SchemaCompiler c(*s, empty, limits);
  std::vector<std::string> names;
  for (const Function& f : functions) {
    if (format == CallFormat::kQwenXml &&
        (f.name.empty() || f.name.find_first_of("<>\n") != std::string::npos))
      throw SchemaError(
          "tools", "",
          fmt::format("the function name '{}' cannot be written as <function=NAME>", brief(f.name)));
    c.set_document(f.parameters);
    try {
      const int root = c.compile(f.parameters);
      if (format == CallFormat::kQwenXml) c.xml_arguments(root, f.parameters);
      s->function_roots_.push_back(root);
    } catch (const SchemaError& e) {
      throw SchemaError(e.keyword, e.path,
                        fmt::format("function '{}' parameters: {}", brief(f.name), e.what()));
    }
    names.push_back(SchemaCompiler::call_name_text(f.name, format));
  }
  c.finish(s->function_roots_);
  if (!name_written) {
    Tagged tagged;
    for (size_t i = 0; i < names.size(); ++i) tagged.emplace_back(names[i], int8_t(i));
    s->function_names_ = build_trie(s->values_, std::move(tagged), false);
  }
  s->call_format_ = format;
  // After "</function>" the '\n' is whitespace the root allows; after hermes arguments the '}' comes first.
  s->suffix_ = format == CallFormat::kQwenXml ? "</tool_call>" : "}\n</tool_call>";
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::choice(const std::vector<std::string>& choices,
                                                     const JsonSchemaLimits& limits) {
  if (choices.empty()) throw SchemaError("choice", "", "choice must list at least one string");
  size_t bytes = 0;
  for (const std::string& choice : choices) {
    bytes += choice.size();
    if (bytes > limits.max_literal_bytes)
      throw SchemaError("choice", "",
                        fmt::format("the choices are more than {} bytes", limits.max_literal_bytes));
  }
  const std::string pattern = literal_alternation(choices);
  JsonSchemaLimits room = limits;
  room.max_pattern_states = std::max(limits.max_pattern_states, bytes + 2);
  try {
    return regex(pattern, room);
  } catch (const SchemaError& e) {
    throw SchemaError("choice", "", fmt::format("choice: {}", e.what()));
  }
}

}  // namespace moeserve
