#include "deploy/structured_file.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace moeserve::deploy {
namespace {

using nlohmann::json;

json scalar_to_json(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() != "?") return s;  // quoted or explicitly tagged: keep the text
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  int64_t i = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
      ec == std::errc() && p == s.data() + s.size())
    return i;
  double d = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
      ec == std::errc() && p == s.data() + s.size())
    return d;
  return s;
}

json to_json(const YAML::Node& node, const std::string& source) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return scalar_to_json(node);
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (const auto& item : node) arr.push_back(to_json(item, source));
      return arr;
    }
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (const auto& kv : node) {
        check(kv.first.IsScalar(), "{} line {}: mapping keys must be plain text", source,
              kv.first.Mark().line + 1);
        std::string key = kv.first.Scalar();
        check(!obj.contains(key), "{} line {}: key '{}' appears twice", source, kv.first.Mark().line + 1,
              key);
        obj[key] = to_json(kv.second, source);
      }
      return obj;
    }
  }
  return nullptr;
}

}  // namespace

json parse_structured_text(const std::string& text, const std::string& source_name) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) {
    try {
      return json::parse(text);
    } catch (const json::parse_error& e) {
      fail("{}: invalid JSON: {}", source_name, e.what());
    }
  }
  try {
    return to_json(YAML::Load(text), source_name);
  } catch (const YAML::Exception& e) {
    fail("{} line {}, column {}: invalid YAML: {}", source_name, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

json load_structured_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), "cannot open {}", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_structured_text(buffer.str(), path);
}

}  // namespace moeserve::deploy
