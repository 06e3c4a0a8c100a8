#include "fake_openai_server.h"

#include <algorithm>
#include <thread>

namespace moeserve::loadgen::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string event(const std::string& data) {
  return "data: " + data + "\n\n";
}

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

void split_words(const std::string& text, std::vector<std::string>& out) {
  std::string word;
  auto flush = [&] {
    if (!word.empty()) out.push_back(word);
    word.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      flush();
    } else if (c == '.') {
      flush();
      out.push_back(".");
    } else {
      word += c;
    }
  }
  flush();
}

// The prompt as the fake "tokenizes" it: a role marker per message, then the words of its content and tool
// calls.
std::vector<std::string> prompt_tokens(const json& messages) {
  std::vector<std::string> tokens;
  for (const json& m : messages) {
    tokens.push_back("<" + m.value("role", std::string("?")) + ">");
    if (m.contains("content") && m["content"].is_string()) split_words(m["content"], tokens);
    if (m.contains("tool_calls"))
      for (const json& call : m["tool_calls"]) split_words(call["function"].value("arguments", ""), tokens);
  }
  return tokens;
}

std::string chunk_json(const std::string& model, const json& delta, const json& finish = nullptr) {
  return json{{"id", "chatcmpl-fake"},
              {"object", "chat.completion.chunk"},
              {"created", 0},
              {"model", model},
              {"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}}}}
      .dump();
}

}  // namespace

size_t FakeOpenAiServer::count_words(const std::string& text) {
  std::vector<std::string> words;
  split_words(text, words);
  return words.size();
}

FakeOpenAiServer::FakeOpenAiServer(FakeScript script)
    : script_(std::move(script)),
      backend_([this](const peers::HttpRequest& r, peers::BackendConnection& c) { handle(r, c); }) {}

FakeOpenAiServer::~FakeOpenAiServer() {
  backend_.stop();
}

std::vector<ServedRequest> FakeOpenAiServer::served() const {
  std::lock_guard lock(mutex_);
  return served_;
}

void FakeOpenAiServer::handle(const peers::HttpRequest& r, peers::BackendConnection& c) {
  if (r.method == "POST" && r.target.starts_with("/v1/chat/completions")) return serve_chat(r.body, c);
  if (r.method == "GET" && r.target.starts_with("/version")) {
    c.respond(200, R"({"version":"fake-1.0"})");
  } else if (r.method == "GET" && r.target.starts_with("/v1/models")) {
    c.respond(200, R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
  } else {
    c.respond(404, R"({"error":{"message":"not found"}})");
  }
}

void FakeOpenAiServer::serve_chat(const std::string& body_text, peers::BackendConnection& c) {
  ServedRequest record;
  record.received = Clock::now();
  record.body = json::parse(body_text, nullptr, false);
  const json& body = record.body;
  size_t index;
  std::vector<std::string> prompt =
      body.is_object() ? prompt_tokens(body.value("messages", json::array())) : std::vector<std::string>{};
  {
    std::lock_guard lock(mutex_);
    index = chat_requests_++;
    if (script_.prefix_cache) {
      for (const auto& earlier : history_) {
        size_t common = 0;
        while (common < earlier.size() && common < prompt.size() && earlier[common] == prompt[common])
          ++common;
        record.cached_tokens = std::max(record.cached_tokens, common);
      }
    }
  }
  record.prompt_tokens = prompt.size();
  Failure failure = script_.failure(index);
  auto remember = [&] {
    std::lock_guard lock(mutex_);
    served_.push_back(record);
  };

  for (const std::string& field : script_.rejected_fields) {
    if (!body.is_object() || !body.contains(field)) continue;
    remember();
    c.respond(400, json{{"error",
                         {{"message", "Unrecognized request argument supplied: " + field},
                          {"type", "invalid_request_error"}}}}
                       .dump());
    return;
  }

  if (failure == Failure::close_before_headers) {
    remember();
    c.hang_up();
    return;
  }
  if (failure == Failure::http_500 || failure == Failure::http_429 || failure == Failure::http_503) {
    remember();
    const int status = failure == Failure::http_500 ? 500 : failure == Failure::http_429 ? 429 : 503;
    const char* message = failure == Failure::http_500   ? "scripted failure"
                          : failure == Failure::http_429 ? "too many requests"
                                                         : "server is draining";
    c.respond(status, json{{"error", {{"message", message}, {"type", "server_error"}}}}.dump());
    return;
  }

  std::string model = body.value("model", std::string("fake-model"));
  size_t max_tokens = body.value("max_tokens", size_t{16});
  bool exact = body.value("ignore_eos", false) || body.contains("min_tokens");
  size_t tokens = exact ? max_tokens : std::min(max_tokens, script_.natural_tokens);
  bool tool_turn = body.contains("tools") && !body["messages"].empty() &&
                   body["messages"].back().value("role", "") == "user" &&
                   body.value("tool_choice", "") != "none";

  if (script_.close_after_response) c.close_after();  // "Connection: close" on the reply
  if (!c.start_stream()) {
    c.hang_up();
    return;
  }
  if (failure == Failure::stall) {
    remember();
    sleep_s(script_.stall_s);
    c.hang_up();
    return;
  }
  c.chunk(event(chunk_json(model, {{"role", "assistant"}, {"content", ""}})));
  sleep_s(script_.ttft_s);

  std::vector<std::string> reply_tokens{"<assistant>"};
  std::string finish = "length";
  if (tool_turn) {
    // A tool call streamed the way vLLM does: the name first, then argument fragments.
    std::vector<std::string> fragments = {R"({"city": )", R"("Paris"})"};
    c.chunk(event(chunk_json(model, {{"tool_calls",
                                      {{{"index", 0},
                                        {"id", "call_fake_" + std::to_string(index)},
                                        {"type", "function"},
                                        {"function", {{"name", "get_weather"}, {"arguments", ""}}}}}}})));
    record.token_sent.push_back(Clock::now());
    for (const auto& fragment : fragments) {
      sleep_s(script_.itl_s);
      c.chunk(event(
          chunk_json(model, {{"tool_calls", {{{"index", 0}, {"function", {{"arguments", fragment}}}}}}})));
      record.token_sent.push_back(Clock::now());
      split_words(fragment, reply_tokens);
    }
    tokens = record.token_sent.size();
    finish = "tool_calls";
  } else {
    if (!exact && tokens < max_tokens) finish = "stop";
    for (size_t i = 0; i < tokens; ++i) {
      if (i > 0) sleep_s(script_.itl_s);
      if ((failure == Failure::close_mid_stream || failure == Failure::error_event ||
           failure == Failure::bad_json) &&
          i == 2)
        break;
      std::string word = "w" + std::to_string(i);
      // Stamped before the write: the client cannot have read the chunk earlier, however this thread is
      // scheduled after the write.
      record.token_sent.push_back(Clock::now());
      if (!c.chunk(event(chunk_json(model, {{"content", " " + word}})))) {
        c.hang_up();
        return;
      }
      reply_tokens.push_back(word);
    }
  }
  if (failure == Failure::close_mid_stream) {
    remember();
    c.hang_up();
    return;
  }
  if (failure == Failure::error_event) {
    c.chunk(event(R"({"error":{"message":"engine failed mid-stream","type":"server_error"}})"));
  } else if (failure == Failure::bad_json) {
    c.chunk(event("{not json"));
  } else {
    c.chunk(event(chunk_json(model, json::object(), finish)));
    json usage = {{"prompt_tokens", record.prompt_tokens},
                  {"completion_tokens", tokens},
                  {"total_tokens", record.prompt_tokens + tokens},
                  {"prompt_tokens_details", {{"cached_tokens", record.cached_tokens}}}};
    const json last = {{"id", "chatcmpl-fake"},
                       {"object", "chat.completion.chunk"},
                       {"choices", json::array()},
                       {"usage", usage}};
    c.chunk(event(last.dump()));
  }
  // Recorded before the stream ends: a client that has read the whole response must find it in served().
  {
    std::lock_guard lock(mutex_);
    if (script_.prefix_cache) {
      std::vector<std::string> sequence = prompt;
      sequence.insert(sequence.end(), reply_tokens.begin(), reply_tokens.end());
      history_.push_back(std::move(sequence));
    }
    served_.push_back(record);
  }
  c.chunk(event("[DONE]"));
  c.end_stream();
}

}  // namespace moeserve::loadgen::testing
