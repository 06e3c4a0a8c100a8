#include "server/sampling_defaults.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/bounded_json.h"
#include "common/error.h"

namespace moeserve::server {

using json = nlohmann::json;

void SamplingDefaults::apply(SamplingSettings& s) const {
  if (temperature && !s.given.temperature) s.temperature = *temperature;
  if (top_p && !s.given.top_p) s.top_p = *top_p;
  if (top_k && !s.given.top_k) s.top_k = *top_k;
  if (min_p && !s.given.min_p) s.min_p = *min_p;
  if (repetition_penalty && !s.given.repetition_penalty) s.repetition_penalty = *repetition_penalty;
}

std::string SamplingDefaults::summary() const {
  std::string out;
  auto add = [&](const char* name, auto v) {
    if (v) out += fmt::format("{}{}={}", out.empty() ? "" : " ", name, *v);
  };
  add("temperature", temperature);
  add("top_p", top_p);
  add("top_k", top_k);
  add("min_p", min_p);
  add("repetition_penalty", repetition_penalty);
  return out;
}

SamplingDefaults SamplingDefaults::load(const std::string& model_dir) {
  SamplingDefaults d;
  const auto path = std::filesystem::path(model_dir) / "generation_config.json";
  if (model_dir.empty() || !std::filesystem::exists(path)) return d;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  json g;
  try {
    g = parse_bounded_json<json>(ss.str());
  } catch (const std::exception& e) {
    fail("{}: {}", path.string(), e.what());
  }
  if (!g.is_object()) return d;
  // The same ranges a request is held to (openai_request.cpp).
  auto number = [&](const char* key, double lo, double hi, bool lo_open) -> std::optional<double> {
    auto it = g.find(key);
    if (it == g.end() || it->is_null()) return std::nullopt;
    double v = it->is_number() ? it->get<double>() : -1e300;
    check(it->is_number() && v <= hi && v >= lo && !(lo_open && v == lo),
          "{}: {} must be a number in {}{}, {}]", path.string(), key, lo_open ? "(" : "[", lo, hi);
    return v;
  };
  d.temperature = number("temperature", 0, 2, false);
  d.top_p = number("top_p", 0, 1, true);
  d.min_p = number("min_p", 0, 1, false);
  d.repetition_penalty = number("repetition_penalty", 0, 10, true);
  if (auto k = number("top_k", -1, 1 << 30, false)) {
    check(*k == double(int(*k)), "{}: top_k must be an integer", path.string());
    d.top_k = *k < 0 ? 0 : int(*k);
  }
  return d;
}

}  // namespace moeserve::server
