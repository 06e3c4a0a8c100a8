#include "text/output_parser.h"

#include <map>
#include <random>

#include "common/bounded_json.h"
#include "common/error.h"
#include "common/parameter_type.h"
#include "text/jinja_value.h"

namespace moeserve::text {

using ordered_json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

bool is_ws(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool all_ws(std::string_view s) {
  for (char c : s)
    if (!is_ws(c)) return false;
  return true;
}

// Length of the longest suffix of s that is a proper prefix of marker: text that might become the marker.
size_t partial_marker(std::string_view s, std::string_view marker) {
  size_t max_len = std::min(s.size(), marker.size() - 1);
  for (size_t len = max_len; len > 0; --len)
    if (s.substr(s.size() - len) == marker.substr(0, len)) return len;
  return 0;
}

size_t trailing_ws(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_ws(s[s.size() - 1 - n])) ++n;
  return n;
}

std::string new_call_id() {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

// json.dumps(value, ensure_ascii=False): what vLLM puts in "arguments".
std::string python_json(const ordered_json& j) {
  return jinja::to_json(jinja::Value::from_json(j));
}

// ---- reasoning ---------------------------------------------------------------------------------

// Splits text into reasoning and content. Leading/trailing whitespace of the reasoning and the whitespace
// right after </think> are dropped (the chat templates put them back when the message is re-rendered).
class ReasoningStage {
 public:
  ReasoningStage(bool enabled, bool starts_inside)
      : state_(!enabled        ? State::kContent
               : starts_inside ? State::kReasoning
                               : State::kStart) {}

  void push(std::string_view text, std::string& reasoning, std::string& content) {
    buf_ += text;
    while (true) {
      switch (state_) {
        case State::kStart: {
          size_t b = 0;
          while (b < buf_.size() && is_ws(buf_[b])) ++b;
          std::string_view rest = std::string_view(buf_).substr(b);
          if (rest.starts_with(kThinkOpen)) {
            buf_.erase(0, b + kThinkOpen.size());
            state_ = State::kReasoning;
            continue;
          }
          if (kThinkOpen.starts_with(rest)) return;  // still might be "<think>"
          state_ = State::kContent;
          continue;
        }
        case State::kReasoning: {
          if (!started_) {  // drop whitespace right after <think>
            size_t b = 0;
            while (b < buf_.size() && is_ws(buf_[b])) ++b;
            buf_.erase(0, b);
            if (buf_.empty()) return;
            started_ = true;
          }
          size_t at = buf_.find(kThinkClose);
          if (at != std::string::npos) {
            std::string_view r = std::string_view(buf_).substr(0, at);
            reasoning += r.substr(0, r.size() - trailing_ws(r));
            buf_.erase(0, at + kThinkClose.size());
            state_ = State::kContent;
            skip_ws_ = true;
            continue;
          }
          size_t hold = partial_marker(buf_, kThinkClose);
          hold += trailing_ws(std::string_view(buf_).substr(0, buf_.size() - hold));
          reasoning += buf_.substr(0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        case State::kContent: {
          if (skip_ws_) {
            size_t b = 0;
            while (b < buf_.size() && is_ws(buf_[b])) ++b;
            buf_.erase(0, b);
            if (buf_.empty()) return;
            skip_ws_ = false;
          }
          content += buf_;
          buf_.clear();
          return;
        }
      }
    }
  }

  void finish(std::string& reasoning, std::string& content) {
    if (state_ == State::kReasoning) {
      std::string_view r = buf_;
      reasoning += r.substr(0, r.size() - trailing_ws(r));
    } else if (!(state_ == State::kContent && skip_ws_)) {
      content += buf_;
    }
    buf_.clear();
  }

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string buf_;
  bool started_ = false;
  bool skip_ws_ = false;
};

// ---- tool calls ---------------------------------------------------------------------------------

// Per function, per parameter: the type its text is converted by (common/parameter_type.h).
struct ToolSchemas {
  std::map<std::string, std::map<std::string, ParameterType>> types;

  explicit ToolSchemas(const ordered_json& tools) {
    if (!tools.is_array()) return;
    for (const auto& t : tools) {
      const ordered_json* fn = t.is_object() && t.contains("function") ? &t["function"] : &t;
      if (!fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) continue;
      auto& params = types[(*fn)["name"].get<std::string>()];
      if (!fn->contains("parameters") || !(*fn)["parameters"].is_object()) continue;
      const nlohmann::json p = (*fn)["parameters"];
      if (!p.contains("properties") || !p["properties"].is_object()) continue;
      for (auto it = p["properties"].begin(); it != p["properties"].end(); ++it)
        params[it.key()] = parameter_type(it.value(), p);
    }
  }

  ParameterType type_of(const std::string& fn, const std::string& param) const {
    auto f = types.find(fn);
    if (f == types.end()) return {};
    auto p = f->second.find(param);
    return p == f->second.end() ? ParameterType{} : p->second;
  }
};

// Text after the reasoning goes through here: plain content and <tool_call> blocks.
class ToolStage {
 public:
  ToolStage(std::string kind, const ordered_json& tools) : kind_(std::move(kind)), schemas_(tools) {}

  void push(std::string_view text, OutputDelta& d, ParsedOutput& all) {
    buf_ += text;
    while (true) {
      if (!in_call_) {
        size_t at = buf_.find(kCallOpen);
        if (at == std::string::npos) {
          size_t hold = partial_marker(buf_, kCallOpen);
          hold += trailing_ws(std::string_view(buf_).substr(0, buf_.size() - hold));
          emit_content(buf_.substr(0, buf_.size() - hold), d, all);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        size_t ws = trailing_ws(std::string_view(buf_).substr(0, at));
        emit_content(buf_.substr(0, at - ws), d, all);
        call_ = Call{};
        call_.lead_ws = buf_.substr(at - ws, ws);
        buf_.erase(0, at + kCallOpen.size());
        in_call_ = true;
        continue;
      }
      size_t end = buf_.find(kCallClose);
      if (end == std::string::npos) {
        size_t take = buf_.size() - partial_marker(buf_, kCallClose);  // "</tool_ca" may be completed later
        call_.text += buf_.substr(0, take);
        buf_.erase(0, take);
        progress(false, d, all);
        return;
      }
      call_.text += buf_.substr(0, end);
      buf_.erase(0, end + kCallClose.size());
      progress(false, d, all);
      after_call_ = complete(d, all, true);
      in_call_ = false;
    }
  }

  void finish(OutputDelta& d, ParsedOutput& all) {
    if (in_call_) {
      call_.text += buf_;
      buf_.clear();
      progress(true, d, all);
      after_call_ = complete(d, all, false);
      in_call_ = false;
    } else if (!(after_call_ && all_ws(buf_))) {
      emit_content(buf_, d, all);
    }
    buf_.clear();
  }

 private:
  struct Call {
    std::string text;      // the block's text after <tool_call>
    bool started = false;  // id/name emitted
    size_t scan = 0;       // qwen3_coder: where the next <parameter= is looked for
    int params = 0;        // parameters emitted
    std::string name;
    std::string lead_ws;  // whitespace before <tool_call>, restored if the block is not a call
  };

  void emit_content(std::string_view s, OutputDelta& d, ParsedOutput& all) {
    if (s.empty()) return;
    if (after_call_) {  // whitespace between or after calls is not content
      size_t b = 0;
      while (b < s.size() && is_ws(s[b])) ++b;
      s.remove_prefix(b);
      if (s.empty()) return;
      after_call_ = false;
    }
    d.content += s;
    all.content += s;
  }

  void start_call(const std::string& name, OutputDelta& d, ParsedOutput& all) {
    call_.started = true;
    call_.name = name;
    ToolCall c{new_call_id(), name, ""};
    all.tool_calls.push_back(c);
    d.tool_calls.push_back({static_cast<int>(all.tool_calls.size()) - 1, c.id, name, ""});
  }

  void add_arguments(const std::string& piece, OutputDelta& d, ParsedOutput& all) {
    if (piece.empty()) return;
    all.tool_calls.back().arguments += piece;
    int index = static_cast<int>(all.tool_calls.size()) - 1;
    if (!d.tool_calls.empty() && d.tool_calls.back().index == index) {
      d.tool_calls.back().arguments += piece;
    } else {
      d.tool_calls.push_back({index, "", "", piece});
    }
  }

  // Emits whatever the call's text now determines. `final`: no more text will come.
  void progress(bool final, OutputDelta& d, ParsedOutput& all) {
    std::string& t = call_.text;
    if (kind_ == "hermes") {
      if (call_.started) return;
      // The name can be announced as soon as it is complete, before the arguments arrive.
      size_t key = t.find("\"name\"");
      if (key == std::string::npos) return;
      size_t colon = t.find_first_not_of(" \t\n\r", key + 6);
      if (colon == std::string::npos || t[colon] != ':') return;
      size_t q = t.find_first_not_of(" \t\n\r", colon + 1);
      if (q == std::string::npos || t[q] != '"') return;
      size_t q2 = t.find('"', q + 1);
      if (q2 == std::string::npos) return;
      size_t brace = t.find_first_not_of(" \t\n\r");
      if (brace != std::string::npos && t[brace] == '{') start_call(t.substr(q + 1, q2 - q - 1), d, all);
      return;
    }
    // qwen3_coder
    if (!call_.started) {
      size_t b = t.find_first_not_of(" \t\n\r");
      if (b == std::string::npos) return;
      static constexpr std::string_view kFn = "<function=";
      if (t.compare(b, std::min(kFn.size(), t.size() - b),
                    kFn.substr(0, std::min(kFn.size(), t.size() - b))) != 0)
        return;  // not a function block: left for complete() to return as content
      size_t close = t.find('>', b);
      if (close == std::string::npos || b + kFn.size() > close) return;
      std::string name = t.substr(b + kFn.size(), close - b - kFn.size());
      if (name.empty() || name.find_first_of("<\n") != std::string::npos) return;
      start_call(name, d, all);
      call_.scan = close + 1;
    }
    static constexpr std::string_view kParam = "<parameter=";
    while (true) {
      size_t p = t.find(kParam, call_.scan);
      if (p == std::string::npos) return;
      size_t gt = t.find('>', p);
      if (gt == std::string::npos) return;
      std::string pname = t.substr(p + kParam.size(), gt - p - kParam.size());
      size_t v = gt + 1;
      // The value ends at </parameter>, or (tolerating a missing one) at the next parameter or </function>.
      size_t ends[] = {t.find("</parameter>", v), t.find(kParam, v), t.find("</function>", v)};
      size_t end = std::min({ends[0], ends[1], ends[2]});
      size_t resume;
      if (end == std::string::npos) {
        if (!final) return;
        end = t.size();
        resume = t.size();
      } else {
        resume = end == ends[0] ? end + 12 : end;
      }
      std::string value = t.substr(v, end - v);
      if (value.starts_with("\n")) value.erase(0, 1);
      if (value.ends_with("\n")) value.pop_back();
      ordered_json converted = convert_parameter(value, schemas_.type_of(call_.name, pname));
      std::string piece =
          (call_.params == 0 ? "{" : ", ") + python_json(pname) + ": " + python_json(converted);
      add_arguments(piece, d, all);
      ++call_.params;
      call_.scan = resume;
    }
  }

  // The block ended (closed: with </tool_call>). Unparseable blocks go back to content verbatim.
  // Returns whether the block was a tool call.
  bool complete(OutputDelta& d, ParsedOutput& all, bool closed) {
    std::string verbatim =
        call_.lead_ws + std::string(kCallOpen) + call_.text + (closed ? std::string(kCallClose) : "");
    if (kind_ == "hermes") {
      auto j = parse_bounded_json_or_discarded<ordered_json>(call_.text);
      bool ok = !j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string();
      if (!ok) {
        if (call_.started) {  // announced but broken: keep the call with empty arguments
          add_arguments("{}", d, all);
          return true;
        }
        after_call_ = false;
        emit_content(verbatim, d, all);
        return false;
      }
      if (!call_.started) start_call(j["name"].get<std::string>(), d, all);
      ordered_json args = j.contains("arguments") ? j["arguments"] : ordered_json::object();
      if (j.contains("parameters") && !j.contains("arguments")) args = j["parameters"];
      // A tool call's arguments are a JSON object (OpenAI's contract, which clients json.loads into kwargs):
      // the object itself, or a string holding one; anything else the model wrote ("x", [1], 1) is empty.
      std::string text = "{}";
      if (args.is_object()) {
        text = python_json(args);
      } else if (args.is_string() &&
                 parse_bounded_json_or_discarded<ordered_json>(args.get<std::string>()).is_object()) {
        text = args.get<std::string>();
      }
      add_arguments(text, d, all);
      return true;
    }
    if (!call_.started) {
      after_call_ = false;
      emit_content(verbatim, d, all);
      return false;
    }
    add_arguments(call_.params == 0 ? "{}" : "}", d, all);
    return true;
  }

  std::string kind_;
  ToolSchemas schemas_;
  std::string buf_;
  bool in_call_ = false;
  bool after_call_ = false;
  Call call_;
};

}  // namespace

// ---- public API ---------------------------------------------------------------------------------

void validate_parser_names(const OutputParserOptions& o) {
  check(o.reasoning_parser.empty() || o.reasoning_parser == "qwen3",
        "unknown reasoning parser '{}' (known: qwen3)", o.reasoning_parser);
  check(o.tool_parser.empty() || o.tool_parser == "qwen3_coder" || o.tool_parser == "hermes",
        "unknown tool-call parser '{}' (known: qwen3_coder, hermes)", o.tool_parser);
}

bool prompt_opens_reasoning(std::string_view prompt) {
  size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  return prompt.find(kThinkClose, open) == std::string_view::npos;
}

struct OutputParser::Impl {
  ReasoningStage reasoning;
  std::unique_ptr<ToolStage> tools;
  ParsedOutput all;

  void route_content(const std::string& content, OutputDelta& d) {
    if (content.empty()) return;
    if (tools) {
      tools->push(content, d, all);
    } else {
      d.content += content;
      all.content += content;
    }
  }
};

OutputParser::OutputParser(const OutputParserOptions& o)
    : impl_(std::make_unique<Impl>(
          Impl{ReasoningStage(o.reasoning_parser == "qwen3", o.starts_in_reasoning),
               o.tool_parser.empty() ? nullptr : std::make_unique<ToolStage>(o.tool_parser, o.tools),
               {}})) {
  validate_parser_names(o);
}

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;

OutputDelta OutputParser::push(std::string_view text) {
  OutputDelta d;
  std::string reasoning, content;
  impl_->reasoning.push(text, reasoning, content);
  d.reasoning_content = reasoning;
  impl_->all.reasoning_content += reasoning;
  impl_->route_content(content, d);
  return d;
}

OutputDelta OutputParser::finish() {
  OutputDelta d;
  std::string reasoning, content;
  impl_->reasoning.finish(reasoning, content);
  d.reasoning_content = reasoning;
  impl_->all.reasoning_content += reasoning;
  impl_->route_content(content, d);
  if (impl_->tools) impl_->tools->finish(d, impl_->all);
  return d;
}

const ParsedOutput& OutputParser::result() const {
  return impl_->all;
}

ParsedOutput OutputParser::parse(std::string_view text, const OutputParserOptions& options) {
  OutputParser p(options);
  p.push(text);
  p.finish();
  return p.result();
}

ordered_json OutputDelta::to_openai() const {
  ordered_json j = ordered_json::object();
  if (!reasoning_content.empty()) j["reasoning_content"] = reasoning_content;
  if (!content.empty()) j["content"] = content;
  if (!tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& c : tool_calls) {
      ordered_json call = {{"index", c.index}};
      ordered_json fn = ordered_json::object();
      if (!c.id.empty()) {
        call["id"] = c.id;
        call["type"] = "function";
        fn["name"] = c.name;
      }
      fn["arguments"] = c.arguments;
      call["function"] = fn;
      calls.push_back(call);
    }
    j["tool_calls"] = calls;
  }
  return j;
}

ordered_json ParsedOutput::to_openai() const {
  ordered_json j = {{"role", "assistant"}};
  j["content"] = content.empty() && !tool_calls.empty() ? ordered_json(nullptr) : ordered_json(content);
  if (!reasoning_content.empty()) j["reasoning_content"] = reasoning_content;
  if (!tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& c : tool_calls)
      calls.push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    j["tool_calls"] = calls;
  }
  return j;
}

}  // namespace moeserve::text
