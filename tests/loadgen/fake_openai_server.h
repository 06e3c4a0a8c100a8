#pragma once
// A scripted OpenAI-compatible chat server on loopback for testing the bench client: the peer library's
// FakeBackend (blocking sockets, one thread per connection, nothing shared with the client's code) answering
// as an OpenAI server would. It streams `max_tokens` one-word chunks
// with known delays, reports usage with cached_tokens (the longest common prefix with earlier prompts and
// replies, the way a prefix cache would), answers tool-bearing requests with a streamed tool call, and fails
// on request when the script says so. It records what it received and when it sent each chunk.

#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fake_backend.h"

namespace moeserve::loadgen::testing {

enum class Failure {
  none,
  http_500,              // 500 with an OpenAI error body
  http_429,              // 429 with an OpenAI error body
  http_503,              // 503 with an OpenAI error body (what a draining or overloaded server answers)
  close_before_headers,  // reads the request, closes the connection
  close_mid_stream,      // streams two tokens, closes the connection
  error_event,           // streams two tokens, then a `data: {"error": ...}` event and [DONE]
  bad_json,              // streams a chunk that is not JSON
  stall,                 // sends the headers, then nothing for `stall_s`
};

struct FakeScript {
  double ttft_s = 0.0;                // after the role chunk, before the first token
  double itl_s = 0.0;                 // between tokens
  size_t natural_tokens = 5;          // reply length when neither ignore_eos nor min_tokens is sent
  bool prefix_cache = true;           // report cached_tokens (costs O(history) per request)
  bool close_after_response = false;  // "Connection: close" on every reply
  double stall_s = 1.0;
  // Body fields answered with a 400, the way OpenAI's own API refuses arguments it does not know.
  std::vector<std::string> rejected_fields;
  // Failure of the n-th chat request (0-based, arrival order).
  std::function<Failure(size_t n)> failure = [](size_t) { return Failure::none; };
};

struct ServedRequest {
  nlohmann::json body;
  std::chrono::steady_clock::time_point received;                 // the whole body was read
  std::vector<std::chrono::steady_clock::time_point> token_sent;  // just before each token chunk is written
  size_t prompt_tokens = 0, cached_tokens = 0;
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeScript script = {});
  ~FakeOpenAiServer();

  int port() const { return backend_.port(); }
  std::string url() const { return backend_.url(); }
  std::vector<ServedRequest> served() const;
  size_t connections() const { return backend_.connections_accepted(); }

  // "Words" of a text the way the fake counts tokens: runs of non-space characters, with each '.' its own.
  static size_t count_words(const std::string& text);

 private:
  void handle(const peers::HttpRequest& request, peers::BackendConnection& c);
  void serve_chat(const std::string& body_text, peers::BackendConnection& c);

  FakeScript script_;
  mutable std::mutex mutex_;
  std::vector<ServedRequest> served_;
  std::vector<std::vector<std::string>> history_;  // token sequences of earlier prompts + replies
  size_t chat_requests_ = 0;
  peers::FakeBackend backend_;  // last: it stops (and its handlers end) before the state above goes
};

}  // namespace moeserve::loadgen::testing
