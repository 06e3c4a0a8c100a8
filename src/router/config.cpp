#include "router/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace moeserve::router {

namespace {

using json = nlohmann::json;

constexpr std::string_view kPolicies = "least_conn|round_robin|power_of_two|cache_aware|random";

// YAML scalars carry no type: numbers and booleans are recognised here, everything else stays a string.
json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& item : node) out[item.first.as<std::string>()] = yaml_to_json(item.second);
      return out;
    }
    case YAML::NodeType::Scalar:
      break;
  }
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted in the file
  if (text == "true" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "no" || text == "off") return false;
  long long integer = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (ec == std::errc() && end == text.data() + text.size()) return integer;
  double real = 0;
  auto [end2, ec2] = std::from_chars(text.data(), text.data() + text.size(), real);
  if (ec2 == std::errc() && end2 == text.data() + text.size()) return real;
  return text;
}

std::string normalize_key(std::string key) {
  for (char& c : key)
    if (c == '-') c = '_';
  return key;
}

Duration duration_value(const json& value, std::string_view key) {
  if (value.is_number()) return Duration(static_cast<int64_t>(std::llround(value.get<double>() * 1000)));
  check(value.is_string(), "'{}' must be a duration such as 30s or 500ms", key);
  return parse_duration(value.get<std::string>());
}

int int_value(const json& value, std::string_view key) {
  check(value.is_number_integer(), "'{}' must be an integer, got {}", key, value.dump());
  return value.get<int>();
}

double number_value(const json& value, std::string_view key) {
  check(value.is_number(), "'{}' must be a number, got {}", key, value.dump());
  return value.get<double>();
}

std::string string_value(const json& value, std::string_view key) {
  check(value.is_string(), "'{}' must be a string, got {}", key, value.dump());
  return value.get<std::string>();
}

bool bool_value(const json& value, std::string_view key) {
  check(value.is_boolean(), "'{}' must be true or false, got {}", key, value.dump());
  return value.get<bool>();
}

BackendSpec backend_value(const json& value) {
  BackendSpec spec;
  if (value.is_string()) {
    spec.url = value.get<std::string>();
    return spec;
  }
  check(value.is_object(), "each backend must be a URL or a mapping with 'url', got {}", value.dump());
  for (const auto& [raw_key, item] : value.items()) {
    std::string key = normalize_key(raw_key);
    if (key == "url") {
      spec.url = string_value(item, "url");
    } else if (key == "weight") {
      spec.weight = int_value(item, "weight");
    } else if (key == "max_fails") {
      spec.max_fails = int_value(item, "max_fails");
    } else if (key == "fail_timeout") {
      spec.fail_timeout = duration_value(item, "fail_timeout");
    } else if (key == "models") {
      check(item.is_array(), "backend 'models' must be a list of names");
      for (const auto& model : item) spec.models.push_back(string_value(model, "models[]"));
    } else {
      fail("unknown backend key '{}' (known: url, weight, max_fails, fail_timeout, models)", raw_key);
    }
  }
  check(!spec.url.empty(), "a backend mapping needs a 'url'");
  return spec;
}

using Setter = std::function<void(RouterConfig&, const json&, std::string_view)>;

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
      {"host", [](RouterConfig& c, const json& v, std::string_view k) { c.host = string_value(v, k); }},
      {"port", [](RouterConfig& c, const json& v, std::string_view k) {
         int port = int_value(v, k);
         check(port >= 0 && port <= 65535, "'port' must be 0..65535, got {}", port);
         c.port = static_cast<uint16_t>(port);
       }},
      {"policy", [](RouterConfig& c, const json& v, std::string_view k) { c.policy = parse_policy(string_value(v, k)); }},
      {"workers", [](RouterConfig& c, const json& v, std::string_view k) { c.workers = int_value(v, k); }},
      {"max_fails", [](RouterConfig& c, const json& v, std::string_view k) { c.max_fails = int_value(v, k); }},
      {"fail_timeout", [](RouterConfig& c, const json& v, std::string_view k) { c.fail_timeout = duration_value(v, k); }},
      {"keepalive", [](RouterConfig& c, const json& v, std::string_view k) { c.keepalive = int_value(v, k); }},
      {"keepalive_timeout",
       [](RouterConfig& c, const json& v, std::string_view k) { c.keepalive_timeout = duration_value(v, k); }},
      {"connect_timeout",
       [](RouterConfig& c, const json& v, std::string_view k) { c.connect_timeout = duration_value(v, k); }},
      {"read_timeout", [](RouterConfig& c, const json& v, std::string_view k) { c.read_timeout = duration_value(v, k); }},
      {"send_timeout", [](RouterConfig& c, const json& v, std::string_view k) { c.send_timeout = duration_value(v, k); }},
      {"client_header_timeout",
       [](RouterConfig& c, const json& v, std::string_view k) { c.client_header_timeout = duration_value(v, k); }},
      {"max_body_size", [](RouterConfig& c, const json& v, std::string_view k) {
         int64_t bytes = v.is_number_integer() ? v.get<int64_t>() : -1;
         check(bytes > 0, "'{}' must be a positive number of bytes", k);
         c.max_body_bytes = static_cast<size_t>(bytes);
       }},
      {"max_body_memory", [](RouterConfig& c, const json& v, std::string_view k) {
         int64_t bytes = v.is_number_integer() ? v.get<int64_t>() : -1;
         check(bytes > 0, "'{}' must be a positive number of bytes", k);
         c.max_body_memory = static_cast<size_t>(bytes);
       }},
      {"max_connections",
       [](RouterConfig& c, const json& v, std::string_view k) { c.max_connections = int_value(v, k); }},
      {"retries", [](RouterConfig& c, const json& v, std::string_view k) { c.retries = int_value(v, k); }},
      {"max_retry_after",
       [](RouterConfig& c, const json& v, std::string_view k) { c.max_retry_after = duration_value(v, k); }},
      {"health_interval",
       [](RouterConfig& c, const json& v, std::string_view k) { c.health_interval = duration_value(v, k); }},
      {"health_timeout",
       [](RouterConfig& c, const json& v, std::string_view k) { c.health_timeout = duration_value(v, k); }},
      {"health_path", [](RouterConfig& c, const json& v, std::string_view k) { c.health_path = string_value(v, k); }},
      {"health_failures",
       [](RouterConfig& c, const json& v, std::string_view k) { c.health_failures = int_value(v, k); }},
      {"health_successes",
       [](RouterConfig& c, const json& v, std::string_view k) { c.health_successes = int_value(v, k); }},
      {"cb_failures", [](RouterConfig& c, const json& v, std::string_view k) { c.cb_failures = int_value(v, k); }},
      {"cb_successes", [](RouterConfig& c, const json& v, std::string_view k) { c.cb_successes = int_value(v, k); }},
      {"cb_timeout", [](RouterConfig& c, const json& v, std::string_view k) { c.cb_timeout = duration_value(v, k); }},
      {"cache_threshold",
       [](RouterConfig& c, const json& v, std::string_view k) { c.cache_threshold = number_value(v, k); }},
      {"balance_abs_threshold",
       [](RouterConfig& c, const json& v, std::string_view k) { c.balance_abs_threshold = int_value(v, k); }},
      {"balance_rel_threshold",
       [](RouterConfig& c, const json& v, std::string_view k) { c.balance_rel_threshold = number_value(v, k); }},
      {"max_tree_size", [](RouterConfig& c, const json& v, std::string_view k) {
         int64_t n = v.is_number_integer() ? v.get<int64_t>() : -1;
         check(n > 0, "'{}' must be a positive number of symbols", k);
         c.max_tree_symbols = static_cast<size_t>(n);
       }},
      {"tokenizer", [](RouterConfig& c, const json& v, std::string_view k) { c.tokenizer = string_value(v, k); }},
      {"session_affinity",
       [](RouterConfig& c, const json& v, std::string_view k) { c.session_affinity = bool_value(v, k); }},
      {"api_key", [](RouterConfig& c, const json& v, std::string_view k) { c.api_key = string_value(v, k); }},
      {"admin_key", [](RouterConfig& c, const json& v, std::string_view k) { c.admin_key = string_value(v, k); }},
      {"shutdown_timeout",
       [](RouterConfig& c, const json& v, std::string_view k) { c.shutdown_timeout = duration_value(v, k); }},
      {"backends", [](RouterConfig& c, const json& v, std::string_view) {
         check(v.is_array(), "'backends' must be a list");
         for (const auto& item : v) c.backends.push_back(backend_value(item));
       }},
  };
  return table;
}

void apply(RouterConfig& config, const json& object, std::string_view origin) {
  for (const auto& [raw_key, value] : object.items()) {
    std::string key = normalize_key(raw_key);
    auto it = setters().find(key);
    if (it == setters().end()) fail("{}: unknown router setting '{}' (see docs/router.md)", origin, raw_key);
    try {
      it->second(config, value, raw_key);
    } catch (const Error& e) {
      fail("{}: {}", origin, e.what());
    }
  }
}

}  // namespace

Policy parse_policy(std::string_view name) {
  if (name == "least_conn") return Policy::least_conn;
  if (name == "round_robin") return Policy::round_robin;
  if (name == "power_of_two") return Policy::power_of_two;
  if (name == "cache_aware") return Policy::cache_aware;
  if (name == "random") return Policy::random;
  fail("unknown routing policy '{}' (choose {})", name, kPolicies);
}

std::string_view policy_name(Policy policy) {
  switch (policy) {
    case Policy::least_conn:
      return "least_conn";
    case Policy::round_robin:
      return "round_robin";
    case Policy::power_of_two:
      return "power_of_two";
    case Policy::cache_aware:
      return "cache_aware";
    case Policy::random:
      return "random";
  }
  return "?";
}

Duration parse_duration(std::string_view text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  check(ec == std::errc() && value >= 0, "bad duration '{}' (use e.g. 30s, 500ms, 5m)", text);
  std::string_view unit(end, text.data() + text.size() - end);
  double ms = 0;
  if (unit.empty() || unit == "s") {
    ms = value * 1000;
  } else if (unit == "ms") {
    ms = value;
  } else if (unit == "m") {
    ms = value * 60'000;
  } else if (unit == "h") {
    ms = value * 3'600'000;
  } else {
    fail("bad duration unit in '{}' (use ms, s, m or h)", text);
  }
  return Duration(static_cast<int64_t>(std::llround(ms)));
}

BackendAddress parse_backend_url(std::string_view url) {
  BackendAddress out;
  std::string_view rest = url;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else {
    check(rest.find("://") == std::string_view::npos,
          "backend '{}': only http:// backends are supported (terminate TLS in front of the router)", url);
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) out.prefix = std::string(rest.substr(slash));
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  check(!authority.empty(), "backend '{}': no host", url);
  std::string_view host = authority;
  std::string_view port;
  if (authority.front() == '[') {  // [v6]:port
    size_t close = authority.find(']');
    check(close != std::string_view::npos, "backend '{}': unclosed '[' in host", url);
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (after.starts_with(':')) port = after.substr(1);
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    check(ec == std::errc() && end == port.data() + port.size() && value > 0 && value < 65536,
          "backend '{}': bad port '{}'", url, port);
    out.port = static_cast<uint16_t>(value);
  }
  check(!host.empty(), "backend '{}': no host", url);
  out.host = std::string(host);
  out.host_header = std::string(authority);
  return out;
}

RouterConfig parse_config(std::string_view text, std::string_view format, std::string_view origin) {
  json document;
  if (format == "json") {
    document = json::parse(text, nullptr, false);
    check(!document.is_discarded(), "{}: not valid JSON", origin);
  } else {
    try {
      document = yaml_to_json(YAML::Load(std::string(text)));
    } catch (const YAML::Exception& e) {
      fail("{}: not valid YAML: {}", origin, e.what());
    }
  }
  check(document.is_object(), "{}: expected a mapping of router settings at the top level", origin);
  RouterConfig config;
  if (document.contains("router")) {
    const json& section = document["router"];
    check(section.is_object(), "{}: 'router' must be a mapping", origin);
    apply(config, section, origin);
    if (document.contains("backends")) apply(config, json{{"backends", document["backends"]}}, origin);
  } else {
    apply(config, document, origin);
  }
  return config;
}

RouterConfig load_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open cluster file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  return parse_config(text.str(), is_json ? "json" : "yaml", path);
}

void validate(const RouterConfig& config) {
  check(!config.backends.empty(), "no backends: pass --backend URL (repeatable) or --config cluster.yaml");
  for (const auto& backend : config.backends) {
    parse_backend_url(backend.url);
    check(backend.weight >= 1, "backend '{}': weight must be at least 1", backend.url);
  }
  check(config.max_fails >= 0, "--max-fails must be 0 (never eject) or more");
  check(config.keepalive >= 0, "--keepalive must be 0 or more");
  check(config.retries >= 0, "--retries must be 0 or more");
  check(config.max_connections >= 1, "--max-connections must be at least 1");
  check(config.max_body_memory >= config.max_body_bytes,
        "--max-body-memory ({} bytes) must hold at least one body of --max-body-size ({} bytes)",
        config.max_body_memory, config.max_body_bytes);
  check(config.health_failures >= 1 && config.health_successes >= 1, "health thresholds must be at least 1");
  check(config.cb_failures >= 1 && config.cb_successes >= 1, "circuit breaker thresholds must be at least 1");
  check(config.cache_threshold >= 0 && config.cache_threshold <= 1, "--cache-threshold must be within 0..1");
  check(config.balance_rel_threshold >= 1, "--balance-rel-threshold must be at least 1");
  check(config.read_timeout.count() > 0 && config.send_timeout.count() > 0 &&
            config.connect_timeout.count() > 0,
        "timeouts must be positive");
}

}  // namespace moeserve::router
