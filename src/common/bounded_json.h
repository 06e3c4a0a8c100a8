#pragma once
// JSON from untrusted peers (request bodies, tool-call arguments, backends' replies), parsed with limits that
// hold *while* parsing: nesting depth, items per array, members per object, values in all.
//
// nlohmann's own DOM parser is iterative, but building an ordered_json copies nested values whenever an
// object's member vector grows (the pair's const key makes the move throwing), which recurses once per level
// and overflows the stack at a few ten thousand levels; each new member is also a linear search for a
// duplicate key, so an object of n members costs n^2. Here every container is built once, at its end, from
// members collected in a vector that moves, with a hash index for duplicate keys (the last value wins at the
// first key's position, as nlohmann does). With the depth bounded, every recursive walker over the result
// (dump, copies, schema compilation, template rendering) has a bounded stack too.

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"

namespace moeserve {

struct JsonLimits {
  // pydantic-core (vLLM's, SGLang's request models) stops at 200 levels; no OpenAI request needs more than a
  // few tens (a JSON schema nests about three levels per level of the document it describes).
  size_t max_depth = 128;
  size_t max_array_items = size_t{1} << 20;  // a prompt of a million token ids
  size_t max_object_members = size_t{1} << 16;
  size_t max_values = size_t{1} << 22;  // ~4M values of 16 bytes: at most ~64 MB of tree per document
};

// The document is not JSON, or exceeds a limit. what() says which, with the byte offset where known; it never
// quotes the input beyond a few bytes.
class JsonParseError : public Error {
 public:
  using Error::Error;
};

// Parses all of `text` (trailing garbage is an error). Instantiated for nlohmann::json and
// nlohmann::ordered_json.
template <class Json>
Json parse_bounded_json(std::string_view text, const JsonLimits& limits = {});

// The same, as an empty optional-like result instead of an exception: returns a discarded value on any error.
template <class Json>
Json parse_bounded_json_or_discarded(std::string_view text, const JsonLimits& limits = {});

}  // namespace moeserve
