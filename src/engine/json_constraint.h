#pragma once
// Structured output: a byte-level, incremental JSON matcher that decoding consults to keep every generated
// token a valid prefix of a JSON document (response_format json_object / json_schema, docs/api.md).
//
// JsonSchema compiles a JSON Schema (a subset, enforced exactly) into a small tree of nodes; anything outside
// the subset is an error that names the keyword, never silently ignored. JsonMatcher is a pushdown automaton
// over that tree, fed bytes: accepts() tries bytes on a copy, advance() commits them, can_end() says a whole
// value has been read (only trailing whitespace may follow, then end of sequence).
//
// Liveness: every prefix the matcher accepts can still be completed (e.g. a key is accepted only while it is
// the prefix of a property that may still come, '}' only once the required properties are there), so decoding
// never walks into a dead end. Whitespace between tokens of JSON is capped at kMaxWhitespaceRun bytes in a
// row: models can loop on whitespace forever, and the cap forces them on.

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve {

constexpr int kMaxWhitespaceRun = 32;

// A schema outside the supported subset or malformed; `keyword` names the offending keyword and `path` where
// it is ("properties.tags.items").
class SchemaError : public std::runtime_error {
 public:
  SchemaError(std::string keyword, std::string path, const std::string& message)
      : std::runtime_error(message), keyword(std::move(keyword)), path(std::move(path)) {}
  std::string keyword;
  std::string path;
};

// One schema: the types a value may have and what each type asks of it; or, when literals is non-empty, only
// those exact texts (enum/const, in the canonical form nlohmann writes them).
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
  uint8_t types = 0;
  std::vector<std::string> literals;
  // Objects: property names as JSON text ("\"name\""), their schemas, required ones, the schema of any
  // other key (-1: none allowed).
  std::vector<std::string> keys;
  std::vector<int> values;
  uint64_t required = 0;
  int additional = -1;
  // Arrays.
  int items = -1;
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: no limit
};

class JsonSchema {
 public:
  // Any JSON object at the top level (response_format json_object).
  static std::shared_ptr<const JsonSchema> any_object();
  // Throws SchemaError. Objects allow properties not listed only when additionalProperties says so (true or
  // a schema), as xgrammar's strict mode does for vLLM.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);

  using Node = JsonSchemaNode;
  const Node& node(int i) const { return nodes_[size_t(i)]; }

 private:
  friend class SchemaCompiler;
  std::vector<Node> nodes_;  // nodes_[0] is the root
};

// One level of the matcher's stack (internal to JsonMatcher).
struct JsonMatcherFrame {
  enum Kind : uint8_t { kRoot, kValue, kObject, kArray, kString, kNumber, kLiteral };
  Kind kind = kValue;
  uint8_t phase = 0;
  int node = 0;
  // Objects: properties read, the current key (-1: an additional one). Arrays: items read.
  uint64_t seen = 0;
  int key = -1;
  int64_t count = 0;
  // Strings: the pending UTF-8 continuation bytes and the range the next one must be in; \u escapes.
  uint8_t utf8_left = 0, utf8_lo = 0x80, utf8_hi = 0xBF;
  bool capture = false;  // an object key with additional properties allowed: kept to look up its schema
  std::string raw;
  // Literals: the texts still possible and how far they matched.
  std::vector<std::string_view> alive;
  size_t pos = 0;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);

  // Whether the bytes may follow what was read so far (the matcher itself is unchanged).
  bool accepts(std::string_view bytes) const;
  // Feeds the bytes; false (and the matcher unchanged) when they are not accepted.
  bool advance(std::string_view bytes);
  // A whole value has been read: the document may end here.
  bool can_end() const;

  using Frame = JsonMatcherFrame;

 private:
  bool feed(uint8_t c);
  bool child_done();

  std::shared_ptr<const JsonSchema> schema_;
  std::vector<Frame> stack_;
  int whitespace_run_ = 0;
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
};

}  // namespace moeserve
