#pragma once
// What the router reads from a request body to route it: the model it names, the text a prefix cache would
// see (for cache_aware) and the session it belongs to (for affinity). Also reads the load a backend reports.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/balancer.h"

namespace moeserve::router {

// Turns text into the symbols cache_aware matches on. The default keeps one symbol per byte of the rendered
// text; a tokenizer-backed one yields token ids (what the backend's radix cache actually keys on).
class KeyEncoder {
 public:
  virtual ~KeyEncoder() = default;
  virtual std::vector<uint32_t> encode(std::string_view text) const;
};

// The byte encoder, or one over the tokenizer.json at `tokenizer_path` (throws moeserve::Error if
// unreadable).
std::shared_ptr<const KeyEncoder> make_key_encoder(const std::string& tokenizer_path);

struct BodyNeeds {
  bool key = false;       // cache_aware
  bool session = false;   // affinity by the "user" field
  bool model = false;     // backends serve different models
  bool response = false;  // a Responses API request: its previous_response_id
};

// `body` is the request body (JSON for the OpenAI routes; anything else routes with an empty RouteRequest).
// Chat messages render as "role\ncontent\n" per message, in order, so conversations that share their first
// turns share a prefix; completions use the prompt (text, or token ids as they are). The body is parsed with
// the default JsonLimits, the same as `moeserve serve`'s; one that starts as a JSON document ('{' or '[') but
// is not one within those limits throws moeserve::JsonParseError (the client gets a 400).
RouteRequest describe_request(std::string_view body, std::string_view session_header, const BodyNeeds& needs,
                              const KeyEncoder& encoder);

// The id of the response an answer of the Responses API carries, from the first bytes of its body: the first
// "id" member whose value starts with "resp" (the response object's own id comes before its items', in the
// JSON of moeserve, vLLM and OpenAI, and in a stream's first event, response.created). nullopt when the
// bytes hold none (yet).
std::optional<std::string> response_id_in(std::string_view body_head);

// The response id a request to the stored responses names in its path (GET or DELETE /v1/responses/{id},
// GET .../input_items, POST .../cancel; a query string aside): the node that made the response holds it, so
// the request routes as a previous_response_id does. nullopt for every other path.
std::optional<std::string> response_id_in_path(std::string_view target);

struct ReportedLoad {
  double requests = -1;  // running + waiting
  double kv_usage = -1;  // 0..1
};
// Reads the running/waiting request gauges and KV usage from a moeserve, vLLM or SGLang /metrics page.
ReportedLoad parse_reported_load(std::string_view metrics_text);

// Retry-After as delta-seconds (the form servers use for 429); nullopt for anything else.
std::optional<double> parse_retry_after(std::string_view value);

}  // namespace moeserve::router
