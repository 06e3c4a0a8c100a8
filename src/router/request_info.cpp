#include "router/request_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"

namespace moeserve::router {

namespace {

using json = nlohmann::json;

// An image's place in the key: a 128-bit digest of its URL (a data: URL's bytes are the encoded image), so
// the key stays short whatever the image's size, the same image in the next turn keeps the conversation's
// prefix, and a different image never looks like a shared one. (The backend's cache keys on the decoded
// pixels; the router does not decode images.)
void append_image(std::string& out, std::string_view url) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x6a09e667f3bcc909ull;
  for (unsigned char c : url) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ c) * 0x9e3779b97f4a7c15ull;
  }
  out += fmt::format("<image {:016x}{:016x}>", a, b);
}

void append_content(std::string& out, const json& content) {
  if (content.is_string()) {
    out += content.get_ref<const std::string&>();
  } else if (content.is_array()) {
    for (const auto& part : content) {
      if (!part.is_object()) continue;
      if (auto text = part.find("text"); text != part.end() && text->is_string()) {
        out += text->get_ref<const std::string&>();
      } else if (auto image = part.find("image_url"); image != part.end()) {
        // OpenAI's {"url": ...}, or the URL itself (vLLM, the Responses API's input_image).
        const json* url = &*image;
        if (image->is_object()) {
          auto it = image->find("url");
          url = it != image->end() ? &*it : nullptr;
        }
        append_image(out, url && url->is_string() ? url->get_ref<const std::string&>() : image->dump());
      } else if (auto source = part.find("source"); source != part.end() && source->is_object()) {
        // Anthropic's image block: base64 data or a url.
        auto data = source->find("data");
        if (data == source->end()) data = source->find("url");
        append_image(out, data != source->end() && data->is_string() ? data->get_ref<const std::string&>()
                                                                     : source->dump());
      }
    }
  }
}

}  // namespace

std::vector<uint32_t> KeyEncoder::encode(std::string_view text) const {
  return std::vector<uint32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                               reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

RouteRequest describe_request(std::string_view body, std::string_view session_header, const BodyNeeds& needs,
                              const KeyEncoder& encoder) {
  RouteRequest out;
  out.session = std::string(session_header);
  if (!(needs.key || needs.session || needs.model || needs.response) || body.empty()) return out;
  size_t first = body.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || (body[first] != '{' && body[first] != '[')) return out;
  json doc = parse_bounded_json<json>(body);
  if (!doc.is_object()) return out;
  if (auto model = doc.find("model"); model != doc.end() && model->is_string())
    out.model = model->get<std::string>();
  if (auto previous = doc.find("previous_response_id");
      needs.response && previous != doc.end() && previous->is_string())
    out.previous_response = previous->get<std::string>();
  if (needs.session && out.session.empty()) {
    if (auto user = doc.find("user"); user != doc.end() && user->is_string())
      out.session = user->get<std::string>();
  }
  if (!needs.key) return out;
  std::string text;
  if (auto messages = doc.find("messages"); messages != doc.end() && messages->is_array()) {
    for (const auto& message : *messages) {
      if (!message.is_object()) continue;
      if (auto role = message.find("role"); role != message.end() && role->is_string())
        text += role->get_ref<const std::string&>();
      text += '\n';
      if (auto content = message.find("content"); content != message.end()) append_content(text, *content);
      text += '\n';
    }
  } else {
    const json* prompt = nullptr;
    for (const char* name : {"prompt", "text", "input_ids", "input"}) {
      if (auto it = doc.find(name); it != doc.end()) {
        prompt = &*it;
        break;
      }
    }
    if (prompt == nullptr) return out;
    const json* first = prompt;
    // A batch of prompts routes by its first one.
    if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) first = &(*prompt)[0];
    if (first->is_string()) {
      text = first->get<std::string>();
    } else if (first->is_array()) {
      for (const auto& id : *first)
        if (id.is_number_integer()) out.key.push_back(id.get<uint32_t>());
      return out;
    }
  }
  out.key = encoder.encode(text);
  return out;
}

std::optional<std::string> response_id_in(std::string_view head) {
  constexpr std::string_view kKey = "\"id\"";
  for (size_t at = head.find(kKey); at != std::string_view::npos; at = head.find(kKey, at + 1)) {
    // Inside a JSON string a quote is escaped: an unescaped "id" followed by ':' is a member's name.
    if (at > 0 && head[at - 1] == '\\') continue;
    size_t i = head.find_first_not_of(" \t\r\n", at + kKey.size());
    if (i == std::string_view::npos || head[i] != ':') continue;
    i = head.find_first_not_of(" \t\r\n", i + 1);
    if (i == std::string_view::npos || head[i] != '"') continue;
    const size_t end = head.find('"', i + 1);
    if (end == std::string_view::npos) return std::nullopt;  // cut off: more bytes will tell
    const std::string_view id = head.substr(i + 1, end - i - 1);
    // Ids are plain ASCII ("resp_" and hex or base62): one with escapes or other bytes is not one.
    const bool plain = std::all_of(id.begin(), id.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
             c == '-';
    });
    if (id.starts_with("resp") && plain) return std::string(id);
  }
  return std::nullopt;
}

std::optional<std::string> response_id_in_path(std::string_view target) {
  constexpr std::string_view kPrefix = "/v1/responses/";
  std::string_view path = target.substr(0, target.find('?'));
  if (!path.starts_with(kPrefix)) return std::nullopt;
  path.remove_prefix(kPrefix.size());
  const std::string_view id = path.substr(0, path.find('/'));
  if (id.empty()) return std::nullopt;
  return std::string(id);
}

ReportedLoad parse_reported_load(std::string_view text) {
  static constexpr std::string_view kRequestGauges[] = {
      "moeserve:num_requests_running", "moeserve:num_requests_waiting", "vllm:num_requests_running",
      "vllm:num_requests_waiting",     "sglang:num_running_reqs",       "sglang:num_queue_reqs"};
  static constexpr std::string_view kKvGauges[] = {"moeserve:kv_cache_usage_perc", "vllm:kv_cache_usage_perc",
                                                   "sglang:token_usage"};
  ReportedLoad out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    std::string_view name = line.substr(0, name_end);
    size_t value_start = line.rfind(' ');
    if (line[name_end] == '{') {
      size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      value_start = line.find(' ', close);
    } else {
      value_start = name_end;
    }
    if (value_start == std::string_view::npos) continue;
    std::string_view value_text = line.substr(value_start + 1);
    value_text = value_text.substr(0, value_text.find(' '));  // drop a timestamp
    double value = 0;
    auto [ptr, ec] = std::from_chars(value_text.data(), value_text.data() + value_text.size(), value);
    if (ec != std::errc()) continue;
    for (auto gauge : kRequestGauges)
      if (name == gauge) out.requests = std::max(0.0, out.requests) + value;
    for (auto gauge : kKvGauges)
      if (name == gauge) out.kv_usage = std::max(out.kv_usage, value);
  }
  return out;
}

std::optional<double> parse_retry_after(std::string_view value) {
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  double seconds = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(seconds) || seconds < 0)
    return std::nullopt;
  // A day at most: the proxy converts to int64 milliseconds, and 1e300 (or inf) would overflow it; the
  // balancer caps the wait again at max_retry_after.
  constexpr double kMaxSeconds = 86400;
  return std::min(seconds, kMaxSeconds);
}

}  // namespace moeserve::router
