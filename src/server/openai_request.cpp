#include "server/openai_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include "common/bounded_json.h"
#include "engine/json_constraint.h"
#include "server/api_error.h"

namespace moeserve::server {

using json = nlohmann::ordered_json;

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::discarded:
      return "invalid";
    default:
      return "a number";
  }
}

}  // namespace

std::string brief(const nlohmann::ordered_json& v) {
  if (v.is_structured()) return type_name(v);
  constexpr size_t kMax = 64;
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

namespace {

// Reads the fields of one JSON object, remembering which were used, so that finish() can name the rest.
// `prefix` names nested objects in messages ("stream_options.include_usage").
class Fields {
 public:
  Fields(const json& object, std::string prefix = "") : object_(object), prefix_(std::move(prefix)) {}

  std::string name(const std::string& key) const { return prefix_ + key; }

  // The value, or nullptr when absent or null (OpenAI treats an explicit null as "not given").
  const json* get(const std::string& key) {
    used_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  // Known and without effect here (e.g. a message's "refusal"): not reported as unknown.
  void ignore(const std::string& key) { used_.insert(key); }

  // A known parameter that has no effect here, still checked for its type so a malformed one is a 400.
  void ignore_typed(const std::string& key, json::value_t type) {
    const json* v = get(key);
    if (!v || v->type() == type) return;
    json expected(type);
    throw invalid_param(name(key), "must be {}, got {}", type_name(expected), type_name(*v));
  }

  std::optional<bool> boolean(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw invalid_param(name(key), "must be a boolean, got {}", type_name(*v));
    return v->get<bool>();
  }

  std::optional<std::string> string(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw invalid_param(name(key), "must be a string, got {}", type_name(*v));
    return v->get<std::string>();
  }

  std::optional<double> number(const std::string& key, double lo, double hi, bool lo_open = false) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw invalid_param(name(key), "must be a number, got {}", type_name(*v));
    double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo)) {
      throw invalid_param(name(key), "must be in {}{}, {}], got {}", lo_open ? "(" : "[", lo, hi, d);
    }
    return d;
  }

  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    return to_integer(*v, name(key), lo, hi);
  }

  static int64_t to_integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
    int64_t i;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
        throw invalid_param(param, "must be at most {}", hi);
      }
      i = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
               v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 9e18) {
      i = static_cast<int64_t>(v.get<double>());  // 4.0 is accepted as 4, as pydantic does
    } else {
      throw invalid_param(param, "must be an integer, got {}", v.is_number() ? v.dump() : type_name(v));
    }
    if (i < lo || i > hi) throw invalid_param(param, "must be in [{}, {}], got {}", lo, hi, i);
    return i;
  }

  // Keys that were not read are parameters this server does not know: accepted and ignored, as vLLM and
  // SGLang do, since clients add new ones faster than servers learn them. Their names go to `ignored`.
  void finish(std::vector<std::string>& ignored) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!used_.count(it.key())) ignored.push_back(name(it.key()));
    }
  }

 private:
  const json& object_;
  std::string prefix_;
  std::set<std::string> used_;
};

constexpr int64_t kMaxN = 128;
constexpr int64_t kMaxTopLogprobs = 20;
constexpr int64_t kMaxTokensCap = int64_t(1) << 30;
constexpr size_t kMaxStopBytes = 1024;

std::vector<int32_t> token_ids(const json& v, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (auto& t : v) ids.push_back(static_cast<int32_t>(Fields::to_integer(t, param, 0, INT32_MAX)));
  return ids;
}

// {"token id": bias, ...} as OpenAI defines it: decimal token-id keys, biases in [-100, 100] added to the
// logits (-100 in effect bans a token, +100 in effect forces it). Sorted by token id.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v) {
  if (!v.is_object())
    throw invalid_param("logit_bias", "must be an object of token id -> bias, got {}", type_name(v));
  std::vector<std::pair<int32_t, float>> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
      throw invalid_param("logit_bias", "keys must be token ids (decimal strings), got '{}'", key);
    }
    const json& bias = it.value();
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::fabs(bias.get<double>()) > 100) {
      throw invalid_param("logit_bias", "the bias of token {} must be a number in [-100, 100], got {}", id,
                          brief(bias));
    }
    out.emplace_back(static_cast<int32_t>(id), bias.get<float>());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void parse_sampling(Fields& f, SamplingSettings& s, bool chat) {
  if (auto v = f.number("temperature", 0, 2)) s.temperature = *v, s.given.temperature = true;
  if (auto v = f.number("top_p", 0, 1, /*lo_open=*/true)) s.top_p = *v, s.given.top_p = true;
  if (auto v = f.integer("top_k", -1, INT32_MAX))
    s.top_k = *v < 0 ? 0 : static_cast<int>(*v), s.given.top_k = true;
  if (auto v = f.number("min_p", 0, 1)) s.min_p = *v, s.given.min_p = true;
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = *v;
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = *v;
  if (auto v = f.number("repetition_penalty", 0, 10, /*lo_open=*/true)) {
    s.repetition_penalty = *v;
    s.given.repetition_penalty = true;
  }
  if (auto v = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*v);
  }
  auto max_tokens = f.integer("max_tokens", 0, kMaxTokensCap);
  if (chat) {
    auto max_completion = f.integer("max_completion_tokens", 0, kMaxTokensCap);
    if (max_completion) max_tokens = max_completion;  // the newer name wins, as in the OpenAI API
  }
  if (max_tokens) s.max_tokens = static_cast<int>(*max_tokens);
  if (auto v = f.integer("min_tokens", 0, kMaxTokensCap)) s.min_tokens = static_cast<int>(*v);
  if (s.max_tokens && s.min_tokens > *s.max_tokens) {
    throw invalid_param("min_tokens", "must not exceed max_tokens ({}), got {}", *s.max_tokens, s.min_tokens);
  }
  if (const json* v = f.get("stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (auto& item : *v) {
        if (!item.is_string()) throw invalid_param("stop", "must be a string or an array of strings");
        s.stop.push_back(item.get<std::string>());
      }
    } else {
      throw invalid_param("stop", "must be a string or an array of strings, got {}", type_name(*v));
    }
    if (s.stop.size() > 64) throw invalid_param("stop", "at most 64 stop strings, got {}", s.stop.size());
    for (auto& stop : s.stop) {
      if (stop.empty()) throw invalid_param("stop", "stop strings must not be empty");
      // Every generated token is checked against every stop string: their length bounds that work per token.
      if (stop.size() > kMaxStopBytes) {
        throw invalid_param("stop", "a stop string may have at most {} bytes, got {}", kMaxStopBytes,
                            stop.size());
      }
    }
  }
  if (const json* v = f.get("stop_token_ids")) {
    if (!v->is_array()) throw invalid_param("stop_token_ids", "must be an array of token ids");
    s.stop_token_ids = token_ids(*v, "stop_token_ids");
  }
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) s.include_stop_str_in_output = *v;
  if (auto v = f.boolean("skip_special_tokens")) s.skip_special_tokens = *v;
  if (const json* v = f.get("logit_bias")) s.logit_bias = parse_logit_bias(*v);
}

void parse_stream(Fields& f, StreamSettings& s, std::vector<std::string>& ignored) {
  if (auto v = f.boolean("stream")) s.stream = *v;
  if (const json* opts = f.get("stream_options")) {
    if (!opts->is_object()) throw invalid_param("stream_options", "must be an object");
    if (!s.stream) throw invalid_param("stream_options", "is only allowed when stream is true");
    Fields o(*opts, "stream_options.");
    if (auto v = o.boolean("include_usage")) s.include_usage = *v;
    if (auto v = o.boolean("continuous_usage_stats")) s.continuous_usage_stats = *v;
    o.finish(ignored);
  }
}

// Parameters OpenAI SDKs and frameworks send that do not change what this server generates: type-checked,
// then ignored. `modalities` is honoured in the only way a text model can: text, or a 400.
void parse_harmless(Fields& f) {
  using T = json::value_t;
  f.ignore_typed("store", T::boolean);
  f.ignore_typed("metadata", T::object);
  f.ignore_typed("service_tier", T::string);
  f.ignore_typed("reasoning_effort", T::string);
  f.ignore_typed("prediction", T::object);  // predicted outputs only make generation faster
  f.ignore_typed("audio", T::object);       // output audio settings: with modalities ["text"], unused
  if (const json* v = f.get("modalities")) {
    if (!v->is_array())
      throw invalid_param("modalities", "must be an array of strings, got {}", type_name(*v));
    for (auto& m : *v) {
      if (m != "text") throw invalid_param("modalities", "this model outputs text only, got {}", brief(m));
    }
  }
}

int parse_priority(Fields& f) {
  auto v = f.integer("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  return v ? static_cast<int>(*v) : 0;
}

// vLLM's structured_outputs {"json" | "regex" | "choice" | "json_object"} and its older guided_json /
// guided_regex / guided_choice, and SGLang's regex: the same constraint as response_format, so at most one of
// all of them. Grammars (guided_grammar, structured_outputs.grammar) stay a 400.
void parse_structured_outputs(Fields& f, ResponseFormat& out) {
  struct Ask {
    std::string param, kind;
    const json* value;
  };
  std::vector<Ask> asks;
  if (const json* so = f.get("structured_outputs")) {
    if (!so->is_object()) throw invalid_param("structured_outputs", "must be an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string& key = it.key();
      if (it->is_null() || (it->is_boolean() && !it->get<bool>())) continue;  // clients send unset fields so
      if (key == "json" || key == "regex" || key == "choice" || key == "json_object") {
        asks.push_back({"structured_outputs." + key, key, &*it});
      } else {
        throw invalid_param("structured_outputs",
                            "'{}' is not supported (json, regex, choice and json_object are)", key);
      }
    }
  }
  for (const auto& [key, kind] :
       std::initializer_list<std::pair<const char*, const char*>>{{"guided_json", "json"},
                                                                  {"guided_regex", "regex"},
                                                                  {"guided_choice", "choice"},
                                                                  {"regex", "regex"}})
    if (const json* v = f.get(key)) asks.push_back({key, kind, v});
  if (f.has("guided_grammar"))
    throw invalid_param("guided_grammar", "grammars are not supported; use a JSON schema or a regex");
  f.ignore("guided_grammar");
  if (asks.empty()) return;
  const Ask& ask = asks[0];
  if (asks.size() > 1 || out.schema) {
    throw invalid_param(ask.param,
                        "only one of response_format, structured_outputs, guided_json, guided_regex, "
                        "guided_choice and regex may be given");
  }
  try {
    if (ask.kind == "json_object") {
      out.type = ResponseFormat::Type::kJsonObject;
      out.schema = JsonSchema::any_object();
    } else if (ask.kind == "json") {
      // A schema, or a string holding one (vLLM takes both).
      const json schema = ask.value->is_string()
                              ? parse_bounded_json<nlohmann::json>(ask.value->get<std::string>())
                              : parse_bounded_json<nlohmann::json>(ask.value->dump());
      out.type = ResponseFormat::Type::kJsonSchema;
      out.schema = JsonSchema::compile(schema);
    } else if (ask.kind == "regex") {
      if (!ask.value->is_string()) throw invalid_param(ask.param, "must be a string (a regular expression)");
      out.type = ResponseFormat::Type::kRegex;
      out.schema = JsonSchema::regex(ask.value->get<std::string>());
    } else {
      if (!ask.value->is_array()) throw invalid_param(ask.param, "must be an array of strings");
      std::vector<std::string> choices;
      for (const json& c : *ask.value) {
        if (!c.is_string())
          throw invalid_param(ask.param, "must be an array of strings, got {}", type_name(c));
        choices.push_back(c.get<std::string>());
      }
      out.type = ResponseFormat::Type::kRegex;
      out.schema = JsonSchema::choice(choices);
    }
  } catch (const SchemaError& e) {
    throw invalid_param(ask.param, "{}", e.what());
  } catch (const JsonParseError& e) {
    throw invalid_param(ask.param, "is not a JSON schema: {}", e.what());
  }
}

// response_format as OpenAI defines it: {"type": "text" | "json_object"} or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}; then vLLM's and SGLang's own fields.
ResponseFormat parse_response_format(Fields& f) {
  ResponseFormat out;
  if (const json* v = f.get("response_format")) {
    if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string()) {
      throw invalid_param("response_format", "must be an object with a string 'type'");
    }
    const std::string type = (*v)["type"].get<std::string>();
    if (type == "json_object") {
      out.type = ResponseFormat::Type::kJsonObject;
      out.schema = JsonSchema::any_object();
    } else if (type == "json_schema") {
      out.type = ResponseFormat::Type::kJsonSchema;
      auto js = v->find("json_schema");
      if (js == v->end() || !js->is_object()) {
        throw invalid_param("response_format", "type 'json_schema' needs a 'json_schema' object");
      }
      if (!js->contains("name") || !(*js)["name"].is_string()) {
        throw invalid_param("response_format", "json_schema.name must be a string");
      }
      out.name = (*js)["name"].get<std::string>();
      if (js->contains("strict") && !(*js)["strict"].is_boolean() && !(*js)["strict"].is_null()) {
        throw invalid_param("response_format", "json_schema.strict must be a boolean");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
        throw invalid_param("response_format", "json_schema.schema must be a JSON Schema object");
      }
      try {
        out.schema = JsonSchema::compile(parse_bounded_json<nlohmann::json>(schema->dump()));
      } catch (const SchemaError& e) {
        throw invalid_param("response_format", "json_schema.schema: {}", e.what());
      }
    } else if (type != "text") {
      throw invalid_param("response_format", "type must be 'text', 'json_object' or 'json_schema', got '{}'",
                          type);
    }
  }
  parse_structured_outputs(f, out);
  // Constraints of other servers that this one does not apply: answering without them would hand the client
  // output it did not ask for.
  for (const char* key : {"ebnf", "structural_tag", "json_schema"}) {
    if (f.has(key)) {
      throw invalid_param(
          key, "is not supported; for JSON output use response_format (json_object or json_schema)");
    }
    f.ignore(key);
  }
  // Decoding controls of vLLM and SGLang that this server does not implement; their no-op values (false, [],
  // a length_penalty of 1) are what clients send by default and pass.
  for (std::string key :
       {"use_beam_search", "length_penalty", "bad_words", "allowed_token_ids", "logits_processors",
        "truncate_prompt_tokens", "custom_logit_processor", "lora_path"}) {
    const json* v = f.get(key);
    bool noop = !v || (v->is_boolean() && !v->get<bool>()) || (v->is_array() && v->empty()) ||
                (key == "length_penalty" && v->is_number() && v->get<double>() == 1.0);
    if (!noop) throw invalid_param(key, "is not supported by this server, got {}", brief(*v));
  }
  return out;
}

void check_best_of(Fields& f, int n) {
  if (auto best_of = f.integer("best_of", 1, kMaxN); best_of && *best_of != n) {
    throw invalid_param("best_of", "only best_of == n is supported (n = {}), got {}", n, *best_of);
  }
}

// Message content: a string, null, or an array of parts. Text parts are joined; an image_url part (its
// `image_url` an object with a `url`, or the URL itself as vLLM also takes it) becomes an {"type": "image"}
// part, which the chat template renders as the model's vision placeholder, and its URL goes to `images` in
// prompt order. Other parts (audio, video, files) are refused.
json normalise_content(const json& content, const std::string& param, std::vector<ImagePart>& images) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) throw invalid_param(param, "must be a string or an array of content parts");
  json parts = json::array();
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      throw invalid_param(p, "must be an object with a string 'type'");
    }
    if (part["type"] == "image_url") {
      const json* url = part.contains("image_url") ? &part["image_url"] : nullptr;
      if (url && url->is_object() && url->contains("url")) url = &(*url)["url"];
      if (!url || !url->is_string())
        throw invalid_param(p + ".image_url", "must be an object with a string 'url'");
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::exchange(text, "")}});
      parts.push_back({{"type", "image"}});
      images.push_back({url->get<std::string>(), p + ".image_url"});
      continue;
    }
    if (part["type"] != "text") {
      throw invalid_param(p + ".type",
                          "content part '{}' is not supported: this server takes text and image_url parts",
                          part["type"].get<std::string>());
    }
    if (!part.contains("text") || !part["text"].is_string())
      throw invalid_param(p + ".text", "must be a string");
    text += part["text"].get<std::string>();
  }
  if (parts.empty()) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

json parse_messages(const json* v, std::vector<std::string>& ignored, std::vector<ImagePart>& images) {
  if (!v) throw invalid_param("messages", "is required");
  if (!v->is_array() || v->empty()) throw invalid_param("messages", "must be a non-empty array");
  json out = json::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw invalid_param(p, "must be an object, got {}", type_name(m));
    Fields f(m, p + ".");
    auto role = f.string("role");
    static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
    if (!role) throw invalid_param(p + ".role", "is required");
    if (!kRoles.count(*role)) {
      throw invalid_param(p + ".role", "must be one of system, developer, user, assistant, tool; got '{}'",
                          *role);
    }
    json msg = {{"role", *role == "developer" ? "system" : *role}};
    const json* content = f.get("content");
    msg["content"] = content ? normalise_content(*content, p + ".content", images) : json(nullptr);
    if (auto name = f.string("name")) msg["name"] = *name;
    if (auto reasoning = f.string("reasoning_content")) msg["reasoning_content"] = *reasoning;
    if (auto reasoning = f.string("reasoning")) msg["reasoning_content"] = *reasoning;
    if (const json* calls = f.get("tool_calls")) {
      if (*role != "assistant")
        throw invalid_param(p + ".tool_calls", "only assistant messages carry tool calls");
      if (!calls->is_array()) throw invalid_param(p + ".tool_calls", "must be an array");
      json norm = json::array();
      for (size_t j = 0; j < calls->size(); ++j) {
        const json& c = (*calls)[j];
        std::string cp = fmt::format("{}.tool_calls[{}]", p, j);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) {
          throw invalid_param(cp + ".function", "is required");
        }
        const json& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string())
          throw invalid_param(cp + ".function.name", "is required");
        json args = fn.contains("arguments") ? fn["arguments"] : json("{}");
        // Templates want arguments as a mapping; clients send the JSON text OpenAI returned.
        if (args.is_string()) {
          try {
            args = parse_bounded_json<json>(args.get<std::string>());
          } catch (const JsonParseError& e) {
            throw invalid_param(cp + ".function.arguments", "is not acceptable JSON: {}", e.what());
          }
        }
        json call = {{"type", "function"}, {"function", {{"name", fn["name"]}, {"arguments", args}}}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        norm.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(norm);
    }
    if (auto id = f.string("tool_call_id")) msg["tool_call_id"] = *id;
    if (*role == "tool" && !msg.contains("tool_call_id")) msg["tool_call_id"] = "";
    f.ignore("refusal");
    f.ignore("annotations");
    f.ignore("audio");
    f.ignore("function_call");
    f.finish(ignored);
    out.push_back(std::move(msg));
  }
  return out;
}

json parse_tools(const json* v) {
  if (!v) return json::array();
  if (!v->is_array()) throw invalid_param("tools", "must be an array");
  json out = json::array();
  std::set<std::string> names;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object()) throw invalid_param(p, "must be an object");
    if (!t.contains("type") || t["type"] != "function")
      throw invalid_param(p + ".type", "must be 'function'");
    if (!t.contains("function") || !t["function"].is_object())
      throw invalid_param(p + ".function", "is required");
    const json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
      throw invalid_param(p + ".function.name", "must be a non-empty string");
    }
    if (fn.contains("parameters") && !fn["parameters"].is_object() && !fn["parameters"].is_null()) {
      throw invalid_param(p + ".function.parameters", "must be a JSON Schema object");
    }
    if (!names.insert(fn["name"].get<std::string>()).second) {
      throw invalid_param(p + ".function.name", "duplicate tool name '{}'", fn["name"].get<std::string>());
    }
    out.push_back(t);
  }
  return out;
}

void parse_tool_choice(const json* v, ChatRequest& r) {
  bool have_tools = !r.tools.empty();
  if (!v) {
    r.tool_choice = have_tools ? ToolChoice::kAuto : ToolChoice::kNone;
    return;
  }
  if (v->is_string()) {
    std::string s = v->get<std::string>();
    if (s == "none")
      r.tool_choice = ToolChoice::kNone;
    else if (s == "auto")
      r.tool_choice = ToolChoice::kAuto;
    else if (s == "required")
      r.tool_choice = ToolChoice::kRequired;
    else
      throw invalid_param("tool_choice", "must be 'none', 'auto', 'required' or a named function; got '{}'",
                          s);
  } else if (v->is_object()) {
    if (!v->contains("function") || !(*v)["function"].is_object() || !(*v)["function"].contains("name") ||
        !(*v)["function"]["name"].is_string()) {
      throw invalid_param("tool_choice",
                          "a named tool choice is {{\"type\": \"function\", \"function\": "
                          "{{\"name\": ...}}}}");
    }
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = (*v)["function"]["name"].get<std::string>();
    bool found = false;
    for (auto& t : r.tools) found |= t["function"]["name"] == r.tool_choice_name;
    if (!found)
      throw invalid_param("tool_choice", "names tool '{}', which is not in tools", r.tool_choice_name);
  } else {
    throw invalid_param("tool_choice", "must be a string or an object, got {}", type_name(*v));
  }
  if (r.tool_choice == ToolChoice::kRequired && !have_tools) {
    throw invalid_param("tool_choice", "'required' needs a non-empty tools array");
  }
  if (!have_tools && r.tool_choice == ToolChoice::kAuto) r.tool_choice = ToolChoice::kNone;
}

// vLLM's mm_processor_kwargs: min_pixels and max_pixels; any other key would change nothing here, so it is a
// 400 naming it rather than silently ignored.
ImageResize parse_mm_processor_kwargs(Fields& f) {
  ImageResize r;
  const json* kw = f.get("mm_processor_kwargs");
  if (!kw) return r;
  if (!kw->is_object())
    throw invalid_param("mm_processor_kwargs", "must be an object, got {}", type_name(*kw));
  for (const auto& item : kw->items()) {
    if (item.key() != "min_pixels" && item.key() != "max_pixels")
      throw invalid_param("mm_processor_kwargs." + item.key(),
                          "is not taken here (min_pixels and max_pixels are: the image resize bounds)");
  }
  Fields k(*kw, "mm_processor_kwargs.");
  constexpr int64_t kMaxPixels = int64_t(1) << 40;
  r.min_pixels = k.integer("min_pixels", 1, kMaxPixels);
  r.max_pixels = k.integer("max_pixels", 1, kMaxPixels);
  if (r.min_pixels && r.max_pixels && *r.min_pixels > *r.max_pixels)
    throw invalid_param("mm_processor_kwargs", "min_pixels {} is above max_pixels {}", *r.min_pixels,
                        *r.max_pixels);
  return r;
}

}  // namespace

json parse_json_object(std::string_view body) {
  json j;
  try {
    j = parse_bounded_json<json>(body);
  } catch (const JsonParseError& e) {
    throw ApiError(400, fmt::format("the request body is not acceptable JSON: {}", e.what()),
                   "invalid_request_error");
  }
  if (!j.is_object()) {
    throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", type_name(j)),
                   "invalid_request_error");
  }
  return j;
}

CompletionRequest parse_completion_request(std::string_view body) {
  json j = parse_json_object(body);
  Fields f(j);
  CompletionRequest r;
  r.model = f.string("model");
  const json* prompt = f.get("prompt");
  if (!prompt) throw invalid_param("prompt", "is required");
  // string | [string] | [int] | [[int]]
  if (prompt->is_string()) {
    r.prompts.emplace_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty()) {
    const json& first = (*prompt)[0];
    if (first.is_number()) {
      r.prompts.emplace_back(token_ids(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& item = (*prompt)[i];
        if (item.is_string())
          r.prompts.emplace_back(item.get<std::string>());
        else if (item.is_array() && !item.empty())
          r.prompts.emplace_back(token_ids(item, fmt::format("prompt[{}]", i)));
        else
          throw invalid_param("prompt",
                              "must be a string, an array of strings, token ids, or arrays of token ids");
      }
    }
  } else {
    throw invalid_param("prompt",
                        "must be a non-empty string, array of strings, token ids, or arrays of token ids");
  }
  for (auto& p : r.prompts) {
    if (auto* s = std::get_if<std::string>(&p); s && s->empty())
      throw invalid_param("prompt", "must not be empty");
  }
  // SGLang's image_data (its /generate field): the images of a single prompt, whose image placeholder tokens
  // (one per image) take them in order. Each is a URL or {"url": ...}.
  if (const json* images = f.get("image_data")) {
    const json list = images->is_array() ? *images : json::array({*images});
    for (size_t i = 0; i < list.size(); ++i) {
      const json* url = &list[i];
      if (url->is_object() && url->contains("url")) url = &(*url)["url"];
      std::string p = images->is_array() ? fmt::format("image_data[{}]", i) : "image_data";
      if (!url->is_string()) throw invalid_param(p, "must be an image URL (data:, http:, https:)");
      r.images.push_back({url->get<std::string>(), p});
    }
    if (!r.images.empty() && r.prompts.size() != 1)
      throw invalid_param("image_data", "goes with a single prompt");
  }
  r.mm_processor_kwargs = parse_mm_processor_kwargs(f);
  if (auto v = f.integer("n", 1, kMaxN)) r.n = static_cast<int>(*v);
  check_best_of(f, r.n);
  if (auto v = f.boolean("echo")) r.echo = *v;
  if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) r.logprobs = static_cast<int>(*v);
  if (auto v = f.integer("prompt_logprobs", 0, kMaxTopLogprobs)) r.prompt_logprobs = static_cast<int>(*v);
  if (auto v = f.boolean("return_token_ids")) r.return_token_ids = *v;
  if (f.has("suffix")) throw invalid_param("suffix", "is not supported");
  parse_sampling(f, r.sampling, /*chat=*/false);
  parse_stream(f, r.stream, r.ignored);
  if (r.sampling.max_tokens && *r.sampling.max_tokens == 0)
    throw invalid_param("max_tokens", "must be at least 1");
  if (auto v = f.string("user")) r.user = *v;
  r.priority = parse_priority(f);
  r.response_format = parse_response_format(f);
  parse_harmless(f);
  f.finish(r.ignored);
  return r;
}

ChatRequest parse_chat_request(std::string_view body) {
  json j = parse_json_object(body);
  Fields f(j);
  ChatRequest r;
  r.model = f.string("model");
  r.messages = parse_messages(f.get("messages"), r.ignored, r.images);
  r.mm_processor_kwargs = parse_mm_processor_kwargs(f);
  r.tools = parse_tools(f.get("tools"));
  parse_tool_choice(f.get("tool_choice"), r);
  if (auto v = f.integer("n", 1, kMaxN)) r.n = static_cast<int>(*v);
  check_best_of(f, r.n);
  if (auto v = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *v;
  if (auto v = f.boolean("logprobs")) r.logprobs = *v;
  if (auto v = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
    if (!r.logprobs) throw invalid_param("top_logprobs", "requires logprobs to be true");
    r.top_logprobs = static_cast<int>(*v);
  }
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (auto v = f.boolean("continue_final_message")) r.continue_final_message = *v;
  if (r.continue_final_message && r.add_generation_prompt) {
    throw invalid_param("continue_final_message", "cannot be combined with add_generation_prompt");
  }
  if (r.continue_final_message && r.messages.back()["role"] != "assistant") {
    throw invalid_param("continue_final_message", "needs the last message to be from the assistant");
  }
  if (auto v = f.boolean("return_token_ids")) r.return_token_ids = *v;
  if (const json* kw = f.get("chat_template_kwargs")) {
    if (!kw->is_object()) throw invalid_param("chat_template_kwargs", "must be an object");
    r.chat_template_kwargs = *kw;
  }
  // Clients written for other servers pass enable_thinking at the top level (SGLang's separate_reasoning
  // examples, some LangChain wrappers); fold it into the template arguments.
  if (auto v = f.boolean("enable_thinking")) r.chat_template_kwargs["enable_thinking"] = *v;
  r.response_format = parse_response_format(f);
  parse_sampling(f, r.sampling, /*chat=*/true);
  if (r.sampling.max_tokens && *r.sampling.max_tokens == 0) {
    throw invalid_param("max_tokens", "must be at least 1");
  }
  parse_stream(f, r.stream, r.ignored);
  if (auto v = f.string("user")) r.user = *v;
  r.priority = parse_priority(f);
  if (f.has("functions") || f.has("function_call")) {
    throw invalid_param(
        f.has("functions") ? "functions" : "function_call",
        "the legacy function-calling parameters are not supported; use tools and tool_choice");
  }
  parse_harmless(f);
  f.finish(r.ignored);
  return r;
}

}  // namespace moeserve::server
