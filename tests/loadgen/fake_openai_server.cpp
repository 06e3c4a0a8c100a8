#include "fake_openai_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "loopback.h"

namespace moeserve::loadgen::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string chunked(const std::string& payload) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
  return size + payload + "\r\n";
}

bool send_event(int fd, const std::string& data) {
  return send_all(fd, chunked("data: " + data + "\n\n"));
}

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
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

FakeOpenAiServer::FakeOpenAiServer(FakeScript script) : script_(std::move(script)) {
  uint16_t port = 0;
  listen_fd_ = peers::listen_loopback(port);
  port_ = port;
  acceptor_ = std::thread([this] { accept_loop(); });
}

FakeOpenAiServer::~FakeOpenAiServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mutex_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
}

std::vector<ServedRequest> FakeOpenAiServer::served() const {
  std::lock_guard lock(mutex_);
  return served_;
}

void FakeOpenAiServer::accept_loop() {
  while (!stopping_) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (stopping_) return;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ++connections_;
    std::lock_guard lock(mutex_);
    open_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { serve_connection(fd); });
  }
}

void FakeOpenAiServer::serve_connection(int fd) {
  std::string buffer;
  char chunk[16384];
  bool keep_alive = true;
  while (keep_alive && !stopping_) {
    size_t header_end;
    while ((header_end = buffer.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) {
        keep_alive = false;
        break;
      }
      buffer.append(chunk, static_cast<size_t>(n));
    }
    if (!keep_alive) break;
    std::string head = lower(buffer.substr(0, header_end));
    size_t content_length = 0;
    if (auto p = head.find("content-length:"); p != std::string::npos)
      content_length = std::stoul(head.substr(p + 15));
    while (buffer.size() < header_end + 4 + content_length) {
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) break;
      buffer.append(chunk, static_cast<size_t>(n));
    }
    std::string body = buffer.substr(header_end + 4, content_length);
    buffer.erase(0, header_end + 4 + content_length);
    std::string request_line = head.substr(0, head.find("\r\n"));
    if (request_line.rfind("post /v1/chat/completions", 0) == 0) {
      serve_chat(fd, body, keep_alive);
      continue;
    }
    std::string reply, status = "200 OK";
    if (request_line.rfind("get /version", 0) == 0) {
      reply = R"({"version":"fake-1.0"})";
    } else if (request_line.rfind("get /v1/models", 0) == 0) {
      reply = R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})";
    } else {
      status = "404 Not Found";
      reply = R"({"error":{"message":"not found"}})";
    }
    send_all(fd, "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(reply.size()) + "\r\n\r\n" + reply);
  }
  std::lock_guard lock(mutex_);
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  ::close(fd);
}

void FakeOpenAiServer::serve_chat(int fd, const std::string& body_text, bool& keep_alive) {
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
    std::string reply =
        json{{"error",
              {{"message", "Unrecognized request argument supplied: " + field}, {"type", "invalid_request_error"}}}}
            .dump();
    send_all(fd, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(reply.size()) + "\r\n\r\n" + reply);
    return;
  }

  if (failure == Failure::close_before_headers) {
    remember();
    keep_alive = false;
    return;
  }
  if (failure == Failure::http_500 || failure == Failure::http_429 || failure == Failure::http_503) {
    remember();
    const char* status = failure == Failure::http_500   ? "500 Internal Server Error"
                         : failure == Failure::http_429 ? "429 Too Many Requests"
                                                        : "503 Service Unavailable";
    const char* message = failure == Failure::http_500   ? "scripted failure"
                          : failure == Failure::http_429 ? "too many requests"
                                                         : "server is draining";
    std::string reply = json{{"error", {{"message", message}, {"type", "server_error"}}}}.dump();
    send_all(fd, std::string("HTTP/1.1 ") + status +
                     "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(reply.size()) +
                     "\r\n\r\n" + reply);
    return;
  }

  std::string model = body.value("model", std::string("fake-model"));
  size_t max_tokens = body.value("max_tokens", size_t{16});
  bool exact = body.value("ignore_eos", false) || body.contains("min_tokens");
  size_t tokens = exact ? max_tokens : std::min(max_tokens, script_.natural_tokens);
  bool tool_turn = body.contains("tools") && !body["messages"].empty() &&
                   body["messages"].back().value("role", "") == "user" &&
                   body.value("tool_choice", "") != "none";

  if (!send_all(
          fd, std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                          "Transfer-Encoding: chunked\r\n") +
                  (script_.close_after_response ? "Connection: close\r\n" : "") + "\r\n")) {
    keep_alive = false;
    return;
  }
  if (failure == Failure::stall) {
    remember();
    sleep_s(script_.stall_s);
    keep_alive = false;
    return;
  }
  send_event(fd, chunk_json(model, {{"role", "assistant"}, {"content", ""}}));
  sleep_s(script_.ttft_s);

  std::vector<std::string> reply_tokens{"<assistant>"};
  std::string finish = "length";
  if (tool_turn) {
    // A tool call streamed the way vLLM does: the name first, then argument fragments.
    std::vector<std::string> fragments = {R"({"city": )", R"("Paris"})"};
    send_event(fd, chunk_json(model, {{"tool_calls",
                                       {{{"index", 0},
                                         {"id", "call_fake_" + std::to_string(index)},
                                         {"type", "function"},
                                         {"function", {{"name", "get_weather"}, {"arguments", ""}}}}}}}));
    record.token_sent.push_back(Clock::now());
    for (const auto& fragment : fragments) {
      sleep_s(script_.itl_s);
      send_event(
          fd, chunk_json(model, {{"tool_calls", {{{"index", 0}, {"function", {{"arguments", fragment}}}}}}}));
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
      if (!send_event(fd, chunk_json(model, {{"content", " " + word}}))) {
        keep_alive = false;
        return;
      }
      reply_tokens.push_back(word);
    }
  }
  if (failure == Failure::close_mid_stream) {
    remember();
    keep_alive = false;
    return;
  }
  if (failure == Failure::error_event) {
    send_event(fd, R"({"error":{"message":"engine failed mid-stream","type":"server_error"}})");
  } else if (failure == Failure::bad_json) {
    send_event(fd, "{not json");
  } else {
    send_event(fd, chunk_json(model, json::object(), finish));
    json usage = {{"prompt_tokens", record.prompt_tokens},
                  {"completion_tokens", tokens},
                  {"total_tokens", record.prompt_tokens + tokens},
                  {"prompt_tokens_details", {{"cached_tokens", record.cached_tokens}}}};
    send_event(fd, json{{"id", "chatcmpl-fake"},
                        {"object", "chat.completion.chunk"},
                        {"choices", json::array()},
                        {"usage", usage}}
                       .dump());
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
  send_event(fd, "[DONE]");
  send_all(fd, "0\r\n\r\n");
  if (script_.close_after_response) keep_alive = false;
}

}  // namespace moeserve::loadgen::testing
