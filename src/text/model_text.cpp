#include "text/model_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace moeserve::text {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open '{}'", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parse_json_file(const fs::path& path) {
  try {
    return json::parse(slurp(path));
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

// A special token is written either as its text or as an AddedToken object {"content": ...}.
std::string token_text(const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  fail("tokenizer_config.json: '{}' must be a string or an object with \"content\", got {}", key, v.dump());
}

}  // namespace

ModelText ModelText::load(const std::string& dir) {
  fs::path root(dir);
  fs::path tokenizer_path = root / "tokenizer.json";
  check(fs::exists(tokenizer_path), "'{}' has no tokenizer.json", dir);
  ModelText m{Tokenizer::from_file(tokenizer_path.string()), {}, {}, {}, {}, {}, {}, {}, {}, {}};

  fs::path config_path = root / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    json config = parse_json_file(config_path);
    check(config.is_object(), "{}: expected a JSON object", config_path.string());
    m.bos_token = token_text(config, "bos_token");
    m.eos_token = token_text(config, "eos_token");
    m.pad_token = token_text(config, "pad_token");
    if (config.contains("chat_template")) {
      const json& t = config["chat_template"];
      if (t.is_string()) {
        m.chat_template = t.get<std::string>();
      } else if (t.is_array()) {
        for (const json& entry : t) {
          check(entry.is_object() && entry.contains("name") && entry.contains("template"),
                "{}: chat_template list entries need \"name\" and \"template\"", config_path.string());
          m.named_templates[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
        }
        if (auto it = m.named_templates.find("default"); it != m.named_templates.end())
          m.chat_template = it->second;
      } else if (!t.is_null()) {
        fail("{}: chat_template must be a string or a list of {{name, template}}", config_path.string());
      }
    }
  }
  if (fs::path jinja = root / "chat_template.jinja"; fs::exists(jinja)) m.chat_template = slurp(jinja);

  auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    if (text.empty()) return std::nullopt;
    return m.tokenizer.token_id(text);
  };
  m.bos_id = id_of(m.bos_token);
  m.eos_id = id_of(m.eos_token);
  m.pad_id = id_of(m.pad_token);
  if (m.eos_id) m.stop_ids.push_back(*m.eos_id);

  if (fs::path gen = root / "generation_config.json"; fs::exists(gen)) {
    json g = parse_json_file(gen);
    if (g.is_object() && g.contains("eos_token_id")) {
      const json& e = g["eos_token_id"];
      std::vector<json> ids = e.is_array() ? std::vector<json>(e.begin(), e.end()) : std::vector<json>{e};
      for (const json& id : ids) {
        if (id.is_null()) continue;
        check(id.is_number_integer(), "{}: eos_token_id must be an integer or a list of integers",
              gen.string());
        m.stop_ids.push_back(id.get<int32_t>());
      }
    }
  }
  std::sort(m.stop_ids.begin(), m.stop_ids.end());
  m.stop_ids.erase(std::unique(m.stop_ids.begin(), m.stop_ids.end()), m.stop_ids.end());
  return m;
}

}  // namespace moeserve::text
