#pragma once
// Structured output: a byte-level, incremental JSON matcher that decoding consults to keep every generated
// token a valid prefix of a JSON document (response_format json_object / json_schema, docs/api.md).
//
// JsonSchema compiles a JSON Schema (a subset, enforced exactly) into a small graph of nodes; anything
// outside the subset is an error that names the keyword, never silently ignored. Enum/const values and
// property names are compiled once into tries, so that following a value costs one trie step per byte
// whatever the number of values. JsonMatcher is a pushdown automaton over that graph, fed bytes: accepts()
// tries bytes on a copy, advance() commits them, can_end() says a whole value has been read (only trailing
// whitespace may follow, then end of sequence). Its frames are plain data, so the copy costs the stack's
// depth, not the schema's size.
//
// Liveness: every prefix the matcher accepts can still be completed (e.g. a key is accepted only while it is
// the prefix of a property that may still come, '}' only once the required properties are there, a container
// only where what it must contain still fits under kMaxNesting), so decoding never walks into a dead end.
// compile() refuses a schema that has no finite value (a $ref that requires itself).
//
// Unions: anyOf/oneOf alternatives that start differently (an object or null) are one node, the first byte
// picking the alternative. Those one node cannot hold (two objects: pydantic's Union[A, B] and discriminated
// unions) are a union node, and the matcher follows each alternative as a state of its own from the value's
// first byte: a byte is accepted while some state takes it, and states that took the same path merge again.
// Whitespace between
// tokens of JSON is capped at kMaxWhitespaceRun bytes in a row: models can loop on whitespace forever, and
// the cap forces them on.

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "engine/json_number.h"
#include "engine/json_string.h"

namespace moeserve {

constexpr int kMaxWhitespaceRun = 32;
// Containers nest at most this deep in a document (bounds the matcher's stack).
constexpr int kMaxNesting = 128;

// A schema outside the supported subset, malformed, or beyond a JsonSchemaLimits; `keyword` names the
// offending keyword (or the limit) and `path` where it is ("properties.tags.items"). Names and values in the
// message are cut short: it never echoes a large part of the schema.
class SchemaError : public Error {
 public:
  // The message is cut to kMaxMessageBytes: paths of deep schemas and quoted names can be long.
  SchemaError(std::string keyword, std::string path, const std::string& message)
      : Error(bounded(message)), keyword(std::move(keyword)), path(std::move(path)) {}
  static constexpr size_t kMaxMessageBytes = 512;
  std::string keyword;
  std::string path;

 private:
  static std::string bounded(const std::string& message) {
    if (message.size() <= kMaxMessageBytes) return message;
    size_t cut = kMaxMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    return message.substr(0, cut) + "... (cut)";
  }
};

// What compile() takes on; beyond any of these the schema is a SchemaError naming the limit. Compilation
// work and the compiled schema's size are linear in what these bound; a decode step costs the same whatever
// their values. The reasons for the defaults are in docs/api.md (OpenAI's structured outputs allow 10 levels
// of object nesting, 5,000 properties, 1,000 enum values and 120,000 characters of names and values).
struct JsonSchemaLimits {
  size_t max_depth = 64;                       // nested subschemas on one path, $ref hops included
  size_t max_properties = 5000;                // object properties in the whole schema
  size_t max_enum_values = 100000;             // enum and const values in the whole schema
  size_t max_literal_bytes = size_t{1} << 20;  // their JSON text and the property names'
  size_t max_nodes = size_t{1} << 16;          // subschemas compiled (a $ref's target once)
  size_t max_pattern_states = 4096;            // automaton states of one pattern
};

// A set of byte strings as a trie, flattened; one holds every enum/const value of a schema, another every
// property name. Node i's edges are first_edge[i] .. first_edge[i + 1] - 1, sorted by byte.
struct JsonTrie {
  static constexpr uint32_t kNone = 0xFFFFFFFF;
  std::vector<uint32_t> first_edge{0};
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_child;
  std::vector<int8_t> tag;      // -1: no string ends at the node; else its tag (a property's index, or 0)
  std::vector<uint64_t> below;  // name tries: the properties whose names go through the node

  uint32_t size() const { return uint32_t(tag.size()); }
  // The node after `byte`, kNone if no string continues so.
  uint32_t child(uint32_t node, uint8_t byte) const;
  bool leaf(uint32_t node) const { return first_edge[node] == first_edge[node + 1]; }
};

// One schema: the types a value may have and what each type asks of it; or, when `values` is set, only the
// texts of that trie (enum/const, in the canonical form nlohmann writes them).
struct JsonSchemaNode {
  enum Type : uint8_t {
    kObject = 1,
    kArray = 2,
    kString = 4,
    kNumber = 8,
    kInteger = 16,
    kBoolean = 32,
    kNull = 64,
    kAll = 127
  };
  static constexpr uint8_t kUnbounded = 0xFF;  // a need no document within kMaxNesting meets
  uint8_t types = 0;
  uint32_t values = JsonTrie::kNone;  // enum/const: root in the schema's value trie
  uint32_t words = JsonTrie::kNone;   // true / false / null as the types allow: root in the value trie
  // Objects: property names as JSON text ("\"name\"", root in the name trie, tagged with their index), their
  // schemas, required ones, the schema of any other key (-1: none allowed).
  uint32_t names = JsonTrie::kNone;
  std::vector<int> properties;
  uint64_t required = 0;
  int additional = -1;
  // Numbers: minimum/maximum/exclusive*/multipleOf, an index into JsonSchema::bounds() (-1: none).
  int bounds = -1;
  // Strings: minLength/maxLength/pattern/format, an index into JsonSchema::strings() (-1: any string).
  int string_rule = -1;
  // Arrays: the schemas of the first items (prefixItems), then `items` for the rest.
  std::vector<int> prefix_items;
  int items = -1;
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: no limit
  // A tool call's arguments in Qwen3.5's XML format (<parameter=NAME>\nVALUE\n</parameter>): the entries
  // "<parameter=NAME>\n" (tagged with the property's index) and "</function>" (tagged with the property
  // count), root in the name trie; the node of each property's value as the parser reads it back.
  uint32_t xml_names = JsonTrie::kNone;
  std::vector<int> xml_values;
  // The value is written as raw text, not JSON (an XML parameter's string): its string_rule never admits '<'.
  bool raw = false;
  // A union node: the value is one of these nodes (never unions themselves; `types` is theirs together).
  std::vector<int> alternatives;
  // The containers a value must nest (0 for a scalar), as an object and as an array: what has to fit below
  // the point where it starts.
  uint8_t need_object = kUnbounded;
  uint8_t need_array = kUnbounded;
  uint8_t need() const;
};

class JsonSchema {
 public:
  // Any JSON object at the top level (response_format json_object).
  static std::shared_ptr<const JsonSchema> any_object();
  // Throws SchemaError. Objects allow properties not listed only when additionalProperties says so (true or
  // a schema), as xgrammar's strict mode does for vLLM.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema,
                                                   const JsonSchemaLimits& limits = {});
  // Not JSON: the whole output matches a regular expression (vLLM's guided_regex, SGLang's regex), or is one
  // of the given strings (guided_choice). Throws SchemaError (keyword "regex" / "choice").
  static std::shared_ptr<const JsonSchema> regex(std::string_view pattern,
                                                 const JsonSchemaLimits& limits = {});
  static std::shared_ptr<const JsonSchema> choice(const std::vector<std::string>& choices,
                                                  const JsonSchemaLimits& limits = {});
  bool raw_text() const { return raw_text_; }

  // A forced tool call: the text after the call's forced opening ("<tool_call>\n<function=" or
  // "<tool_call>\n{\"name\": \""; with `name_written`, the opening names the one function too), in the
  // model's format, to the end of the call: a function's name, then arguments that validate against its
  // `parameters`, as the tool parser (text/output_parser.h) reads them back. Throws SchemaError.
  enum class CallFormat : uint8_t { kHermes, kQwenXml };
  struct Function {
    std::string name;
    nlohmann::json parameters;
  };
  static std::shared_ptr<const JsonSchema> tool_call(const std::vector<Function>& functions,
                                                     CallFormat format, bool name_written,
                                                     const JsonSchemaLimits& limits = {});
  // Tool calls: the root node of each function's arguments, and the trie of the function names as written
  // (tagged with their index; kNone when the name is already written).
  bool call() const { return !function_roots_.empty(); }
  CallFormat call_format() const { return call_format_; }
  int function_root(int i) const { return function_roots_[size_t(i)]; }
  uint32_t function_names() const { return function_names_; }

  // Fixed text after the value (a tool call's end): the document ends only after all of it.
  const std::string& suffix() const { return suffix_; }

  using Node = JsonSchemaNode;
  const Node& node(int i) const { return nodes_[size_t(i)]; }
  size_t node_count() const { return nodes_.size(); }
  const JsonTrie& values() const { return values_; }
  const JsonTrie& names() const { return names_; }
  const NumberBounds& bounds(int i) const { return bounds_[size_t(i)]; }
  const StringRule& string_rule(int i) const { return strings_[size_t(i)]; }
  // The schema of item `index` of an array of `node`.
  int item(const Node& array, int64_t index) const {
    return index < int64_t(array.prefix_items.size()) ? array.prefix_items[size_t(index)] : array.items;
  }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  JsonTrie values_;
  JsonTrie names_;
  std::vector<NumberBounds> bounds_;
  std::vector<StringRule> strings_;
  bool raw_text_ = false;
  std::string suffix_;
  std::vector<int> function_roots_;
  uint32_t function_names_ = JsonTrie::kNone;  // in values_
  CallFormat call_format_ = CallFormat::kHermes;
};

// One level of the matcher's stack (internal to JsonMatcher). Plain data: copying a stack is a memcpy.
struct JsonMatcherFrame {
  // kLiteral follows the value trie, kName a property name in the name trie (no other keys allowed).
  // kText: the whole output is text a StringRule accepts (no JSON around it). kCall: a tool call's function
  // name; kXmlObject: its arguments as XML parameters, kXmlText one's raw text.
  enum Kind : uint8_t {
    kRoot,
    kValue,
    kObject,
    kArray,
    kString,
    kNumber,
    kLiteral,
    kName,
    kText,
    kCall,
    kXmlObject,
    kXmlText
  };
  Kind kind = kValue;
  uint8_t phase = 0;
  // Strings: the pending UTF-8 continuation bytes and the range the next one must be in.
  uint8_t utf8_left = 0, utf8_lo = 0x80, utf8_hi = 0xBF, utf8_total = 0;
  // A string that is an object key where other keys are allowed: `trie` follows it in the name trie, to know
  // whether it names a property.
  bool key = false;
  // Objects: other keys may start here (additionalProperties, and its schema fits below).
  bool open = false;
  int node = 0;
  uint32_t trie = JsonTrie::kNone;
  // Objects: properties read, and those whose value would not fit below. Strings: a \u escape's value so far.
  uint64_t seen = 0;
  int key_index = -1;  // objects: the current key's property (-1: another key)
  // Arrays: items read. Strings: 1 while a high surrogate waits for its low half.
  int64_t count = 0;
  // Strings under a StringRule: the automaton's state, the characters read, and a \u escape's high
  // surrogate while its low half is read. `seen` collects a multi-byte character's bits.
  uint32_t rx = 0;
  uint32_t length = 0;
  uint32_t high = 0;

  friend bool operator==(const JsonMatcherFrame&, const JsonMatcherFrame&) = default;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);

  // Whether the bytes may follow what was read so far (the matcher itself is unchanged). It works in scratch
  // states of the matcher's: one matcher is used by one thread at a time (a request's sampler).
  bool accepts(std::string_view bytes) const;
  // Feeds the bytes; false (and the matcher unchanged) when they are not accepted.
  bool advance(std::string_view bytes);
  // A whole value has been read: the document may end here.
  bool can_end() const;

  // The alternatives of unions followed at once (1 outside a union's value). Beyond kMaxStates the later
  // ones are dropped: what is written still validates, only fewer of the valid documents remain open.
  size_t states() const { return states_.size(); }
  static constexpr size_t kMaxStates = 64;

  // Work done so far, in steps of a fixed cost (a byte fed, a frame copied, a trie edge looked at): what
  // tests and benchmarks read to see that a step costs the same whatever the schema's size.
  uint64_t work() const { return work_; }

  using Frame = JsonMatcherFrame;

 private:
  struct State {
    std::vector<Frame> stack;
    int whitespace_run = 0;
    std::string number;  // the text of a bounded number being read (only the top frame can be one)
    bool operator==(const State&) const = default;
  };
  // What a frame did with a byte: took it, refused it, or finished and passed it on to the new top.
  enum class Step : uint8_t { kTaken, kReject, kPass };
  bool feed(State& s, uint8_t c) const;
  Step feed_value(State& s, uint8_t c) const;
  Step feed_literal(State& s, uint8_t c) const;
  Step feed_name(State& s, uint8_t c) const;
  Step feed_number(State& s, uint8_t c) const;
  Step feed_string(State& s, uint8_t c) const;
  Step feed_object(State& s, uint8_t c) const;
  Step feed_array(State& s, uint8_t c) const;
  void follow_key(Frame& f, uint8_t c) const;
  static bool utf8_lead(Frame& f, uint8_t c);
  static bool escape_hex(Frame& f, uint8_t c);
  Step feed_text(State& s, uint8_t c) const;
  Step feed_call(State& s, uint8_t c) const;
  Step feed_xml_object(State& s, uint8_t c) const;
  Step feed_xml_text(State& s, uint8_t c) const;
  Step raw_char(Frame& f, uint8_t c) const;
  void start_arguments(State& s, int function) const;
  void open_xml(Frame& f, size_t index) const;
  bool follow_rule(Frame& f, uint8_t c, uint8_t phase_before, bool raw = false) const;
  bool rule_takes(Frame& f, uint32_t cp) const;
  bool child_done(State& s) const;
  bool number_in_bounds(const Frame& f, const std::string& text) const;
  size_t run(std::string_view bytes, bool first) const;
  void start(const State& from, size_t at) const;
  bool can_end(const State& s) const;
  bool fits(int node, size_t index) const;
  uint32_t step(const JsonTrie& trie, uint32_t node, uint8_t c) const;
  void open_object(Frame& f, size_t index) const;

  std::shared_ptr<const JsonSchema> schema_;
  std::vector<State> states_;  // one per union alternative still followed; never empty
  // run() works here, reusing what has grown: no allocation per call. scratch_[0 .. used_) are the states
  // being fed, pending_ (state, next byte) those still to feed, done_ those that took every byte, forks_
  // the states a union's first byte made (to be fed that byte).
  mutable std::vector<State> scratch_;
  mutable size_t used_ = 0;
  mutable std::vector<std::pair<size_t, size_t>> pending_;
  mutable std::vector<size_t> done_;
  mutable std::vector<State> forks_;
  mutable uint64_t work_ = 0;
};

// What a request's output must be, handed to the engine with its sampling parameters. The token table is
// built once per server from the tokenizer and shared by every request.
struct TokenBytes {
  std::vector<std::string> bytes;  // per vocabulary id: the bytes it adds to the text
  std::vector<uint8_t> usable;     // 0: never inside JSON (added/special tokens, ids without bytes)
};

struct JsonConstraint {
  std::shared_ptr<const JsonSchema> schema;
  std::shared_ptr<const TokenBytes> vocab;
  // Decoding is free until this token was generated (a reasoning model's </think>), constrained after it.
  std::optional<int32_t> start_after_token;
  // Added tokens that may be chosen where the matcher accepts their text (</tool_call> in a suffix); the
  // others never are.
  std::vector<int32_t> control_tokens;
};

}  // namespace moeserve
