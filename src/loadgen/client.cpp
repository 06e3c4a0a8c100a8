// The only translation unit that includes Boost.Beast/Asio (about 30 s to compile): connection handling,
// request timing and the scheduling of dialogues. What the bytes mean is decided elsewhere (sse, chat_stream,
// scenario), so this file is about sockets and time only.
#include "loadgen/client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "loadgen/chat_stream.h"
#include "loadgen/sse.h"
#include "common/error.h"

namespace moeserve::loadgen {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;

constexpr auto nothrow = asio::as_tuple(asio::use_awaitable);
constexpr size_t kErrorBodyLimit = 64 * 1024;  // keep this much of an error response
constexpr size_t kWholeBodyLimit = 16 << 20;   // a non-streamed reply larger than this is cut

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Connection {
  explicit Connection(asio::any_io_executor executor) : stream(std::move(executor)) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool reused = false;  // has served a request before: the server may have closed it meanwhile
};

// What a server that closed a kept-alive connection looks like before it answered.
bool closed_early(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe;
}

// The failure cause of a socket or parse error (docs/bench.md lists them).
std::string cause_of(const beast::error_code& ec, bool in_body, bool stopping) {
  if (stopping && ec == asio::error::operation_aborted) return "cancelled";
  if (ec == beast::error::timeout) return "timeout";
  if (closed_early(ec) || ec == http::error::partial_message)
    return in_body ? "stream_truncated" : "connection_closed";
  if (ec.category() == http::make_error_code(http::error::bad_version).category()) return "bad_response";
  return "read";
}

// The message an OpenAI-style error body carries ({"error": {"message"}}, {"message"}, {"detail"}).
std::string error_text(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) return (*e)["message"];
      if (e->is_string()) return *e;
    }
    for (const char* key : {"message", "detail"})
      if (auto m = j.find(key); m != j.end() && m->is_string()) return *m;
  }
  return body.substr(0, 300);
}

// A counting semaphore for a request-rate run with a concurrency cap; waiters are woken in order.
class Slots {
 public:
  explicit Slots(size_t cap) : cap_(cap) {}

  // False when the run stopped while waiting (no slot is held then).
  awaitable<bool> acquire() {
    if (cap_ == 0 || used_ < cap_) {
      ++used_;
      co_return true;
    }
    Waiter waiter{
        asio::steady_timer(co_await asio::this_coro::executor, asio::steady_timer::time_point::max())};
    waiters_.push_back(&waiter);
    co_await waiter.timer.async_wait(nothrow);
    co_return waiter.granted;  // granted: the releasing request handed its slot over
  }

  void release() {
    if (waiters_.empty()) {
      --used_;
      return;
    }
    Waiter* next = waiters_.front();
    waiters_.pop_front();
    next->granted = true;
    next->timer.cancel();
  }

  void wake_all() {
    for (Waiter* w : waiters_) w->timer.cancel();
    waiters_.clear();
  }

 private:
  struct Waiter {
    asio::steady_timer timer;
    bool granted = false;
  };
  size_t cap_;
  size_t used_ = 0;
  std::deque<Waiter*> waiters_;
};

class Runner {
 public:
  Runner(const Endpoint& endpoint, const LoadOptions& load, const WorkloadOptions& workload,
         const PromptGenerator& prompts, const ProgressFn& progress)
      : endpoint_(endpoint),
        load_(load),
        workload_(workload),
        prompts_(prompts),
        progress_(progress),
        slots_(load.request_rate > 0 ? load.concurrency : 0),
        progress_timer_(io_),
        arrival_timer_(io_),
        signals_(io_, SIGINT) {
    check(load.num_requests > 0 || load.duration_s > 0, "bench needs a bound: --num-requests or --duration");
    check(load.request_rate > 0 || load.concurrency > 0, "--concurrency must be at least 1");
    beast::error_code ec;
    tcp::resolver resolver(io_);
    targets_ = resolver.resolve(endpoint.host, endpoint.port, ec);
    check(!ec, "cannot resolve {}: {}", endpoint.url(), ec.message());
    size_t per = requests_per_conversation(workload);
    planned_dialogues_ =
        load.num_requests > 0 ? (load.num_requests + per - 1) / per : std::numeric_limits<size_t>::max();
    planned_requests_ = load.num_requests > 0 ? planned_dialogues_ * per : 0;
  }

  LoadResult run() {
    start_ = Clock::now();
    deadline_ = load_.duration_s > 0 ? start_ + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(load_.duration_s))
                                     : Clock::time_point::max();
    signals_.async_wait([this](const beast::error_code& ec, int) { on_signal(ec); });
    if (load_.request_rate > 0) {
      spawn(arrivals());
    } else {
      for (size_t i = 0; i < load_.concurrency; ++i) spawn(worker());
    }
    if (progress_) asio::co_spawn(io_, report_progress(), asio::detached);
    io_.run();
    if (error_) std::rethrow_exception(error_);
    std::sort(records_.begin(), records_.end(), [](auto& a, auto& b) { return a.id < b.id; });
    LoadResult result;
    result.records = std::move(records_);
    result.duration_s = issued_ > 0 ? seconds(last_end_ - first_sent_) : 0;
    result.interrupted = interrupted_;
    return result;
  }

 private:
  struct Outcome {
    RequestRecord record;
    Reply reply;
  };
  enum class After { keep, drop, retry };

  bool may_issue() const { return !stopping_ && Clock::now() < deadline_; }

  void spawn(awaitable<void> task) {
    ++active_;
    asio::co_spawn(io_, std::move(task), [this](std::exception_ptr e) {
      if (e && !error_) {
        error_ = e;
        stop();
      }
      if (--active_ == 0) finish();
    });
  }

  void finish() {
    finished_ = true;
    progress_timer_.cancel();
    arrival_timer_.cancel();
    signals_.cancel();
  }

  void stop() {
    stopping_ = true;
    arrival_timer_.cancel();
    slots_.wake_all();
    for (Connection* c : active_connections_) c->stream.cancel();
  }

  void on_signal(const beast::error_code& ec) {
    if (ec) return;
    interrupted_ = true;
    stop();
    // A second Ctrl-C leaves at once.
    signals_.async_wait([](const beast::error_code& again, int) {
      if (!again) std::_Exit(130);
    });
  }

  awaitable<void> report_progress() {
    while (!finished_) {
      progress_(snapshot(false));
      progress_timer_.expires_after(std::chrono::milliseconds(100));
      co_await progress_timer_.async_wait(nothrow);
    }
    progress_(snapshot(true));
  }

  Progress snapshot(bool finished) const {
    Progress p;
    p.issued = issued_;
    p.completed = completed_;
    p.failed = failed_;
    p.in_flight = in_flight_;
    p.planned = planned_requests_;
    p.elapsed_s = seconds(Clock::now() - start_);
    p.duration_s = load_.duration_s;
    p.finished = finished;
    return p;
  }

  // Closed loop: each worker plays one dialogue after another.
  awaitable<void> worker() {
    while (may_issue() && next_dialogue_ < planned_dialogues_) co_await dialogue(next_dialogue_++);
  }

  // Open loop: dialogues start at Poisson arrival times, whatever is in flight.
  awaitable<void> arrivals() {
    std::mt19937_64 rng(load_.seed);
    std::exponential_distribution<double> gap(load_.request_rate);
    for (size_t i = 0; i < planned_dialogues_ && may_issue(); ++i) {
      spawn(dialogue(i));
      arrival_timer_.expires_after(
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng))));
      co_await arrival_timer_.async_wait(nothrow);
    }
  }

  awaitable<void> dialogue(size_t index) {
    Conversation conversation(workload_, prompts_, index);
    while (!conversation.done() && may_issue()) {
      if (!co_await slots_.acquire()) break;
      if (!may_issue()) {
        slots_.release();
        break;
      }
      TurnRequest request = conversation.next();
      Outcome outcome = co_await send(request, index);
      slots_.release();
      if (outcome.record.ok) {
        conversation.complete(outcome.reply);
      } else {
        conversation.abandon();
      }
      records_.push_back(std::move(outcome.record));
    }
  }

  std::unique_ptr<Connection> take_connection() {
    if (idle_.empty()) return std::make_unique<Connection>(io_.get_executor());
    auto c = std::move(idle_.back());
    idle_.pop_back();
    return c;
  }

  awaitable<Outcome> send(const TurnRequest& request, size_t conversation) {
    Outcome out;
    RequestRecord& r = out.record;
    r.id = issued_++;
    r.conversation = conversation;
    r.turn = request.turn;
    r.expected_input_tokens = request.expected_input_tokens;
    r.expected_output_tokens = request.expected_output_tokens;
    r.exact_output = request.exact_output;
    r.images = request.images;
    ++in_flight_;
    for (int attempt = 0;; ++attempt) {
      // A retry never takes another idle connection: that one could be stale too.
      auto conn = attempt == 0 ? take_connection() : std::make_unique<Connection>(io_.get_executor());
      active_connections_.insert(conn.get());
      After after = co_await exchange(*conn, request, out);
      active_connections_.erase(conn.get());
      if (after == After::retry && attempt == 0) continue;  // a stale kept-alive connection: once more
      if (after == After::keep) {
        conn->reused = true;
        conn->stream.expires_never();
        idle_.push_back(std::move(conn));
      }
      break;
    }
    --in_flight_;
    ++(r.ok ? completed_ : failed_);
    co_return out;
  }

  void set_error(RequestRecord& r, std::string cause, std::string message) {
    r.ok = false;
    r.error_cause = std::move(cause);
    r.error_message = std::move(message);
  }

  // One request/response on `conn`. Fills out.record (and out.reply on success).
  awaitable<After> exchange(Connection& conn, const TurnRequest& request, Outcome& out) {
    RequestRecord& r = out.record;
    auto timeout =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(load_.request_timeout_s));

    Clock::time_point sent = Clock::now();
    conn.stream.expires_at(sent + timeout);
    if (!conn.stream.socket().is_open()) {
      auto [ec, ep] = co_await conn.stream.async_connect(targets_, nothrow);
      if (ec) {
        set_error(r,
                  stopping_                     ? "cancelled"
                  : ec == beast::error::timeout ? "timeout"
                                                : "connect",
                  endpoint_.url() + ": " + ec.message());
        co_return After::drop;
      }
    }

    http::request<http::string_body> req{http::verb::post, endpoint_.api("/chat/completions"), 11};
    req.set(http::field::host, endpoint_.host + ":" + endpoint_.port);
    req.set(http::field::user_agent, "moeserve-bench");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    if (!load_.api_key.empty()) req.set(http::field::authorization, "Bearer " + load_.api_key);
    req.keep_alive(true);
    req.body() = request.body;
    req.prepare_payload();

    // The clock starts when the request leaves (after connecting), like vllm bench serve's.
    sent = Clock::now();
    if (first_sent_ == Clock::time_point{} || sent < first_sent_) first_sent_ = sent;
    r.start_s = seconds(sent - start_);
    conn.stream.expires_at(sent + timeout);
    if (auto [ec, n] = co_await http::async_write(conn.stream, req, nothrow); ec) {
      if (conn.reused && !stopping_) co_return After::retry;
      set_error(r, stopping_ ? "cancelled" : ec == beast::error::timeout ? "timeout" : "write", ec.message());
      co_return After::drop;
    }

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    if (auto [ec, n] = co_await http::async_read_header(conn.stream, conn.buffer, parser, nothrow); ec) {
      if (conn.reused && closed_early(ec) && !stopping_) co_return After::retry;
      set_error(r, cause_of(ec, false, stopping_), ec.message());
      last_end_ = std::max(last_end_, Clock::now());
      co_return After::drop;
    }
    r.http_status = static_cast<int>(parser.get().result_int());
    bool success = r.http_status / 100 == 2;
    bool streamed =
        parser.get()[http::field::content_type].find("text/event-stream") != beast::string_view::npos;

    ChatStream chat(sent);
    SseParser sse;
    std::string whole;  // a non-streamed or error body
    beast::error_code read_error;
    char chunk[16 * 1024];
    Clock::time_point end = Clock::now();
    while (!parser.is_done()) {
      auto& body = parser.get().body();
      body.data = chunk;
      body.size = sizeof chunk;
      auto [ec, n] = co_await http::async_read_some(conn.stream, conn.buffer, parser, nothrow);
      end = Clock::now();
      std::string_view got(chunk, sizeof chunk - parser.get().body().size);
      if (success && streamed) {
        sse.feed(got, [&](std::string_view data) { chat.on_event(data, end); });
      } else if (whole.size() < (success ? kWholeBodyLimit : kErrorBodyLimit)) {
        whole.append(got);
      }
      if (ec == http::error::need_buffer) continue;
      if (ec) {
        read_error = ec;
        break;
      }
    }
    last_end_ = std::max(last_end_, end);

    if (!success) {
      set_error(r, "http_" + std::to_string(r.http_status), error_text(whole));
      co_return read_error || !parser.keep_alive() ? After::drop : After::keep;
    }
    if (!streamed && !read_error) chat.on_full_response(whole, end);
    chat.fill(r, end);
    if (chat.failed()) {
      set_error(r, chat.error_cause(), chat.error_message());
    } else if (read_error) {
      set_error(r, cause_of(read_error, true, stopping_), read_error.message());
    } else if (!chat.done() && !chat.finished()) {
      set_error(r, "stream_truncated", "the stream ended without [DONE] or a finish_reason");
    } else if (r.chunks == 0) {
      set_error(r, "no_output", "the response carried no generated text");
    } else {
      r.ok = true;
      out.reply = chat.reply();
    }
    co_return !read_error && parser.keep_alive() ? After::keep : After::drop;
  }

  const Endpoint& endpoint_;
  const LoadOptions& load_;
  const WorkloadOptions& workload_;
  const PromptGenerator& prompts_;
  const ProgressFn& progress_;

  asio::io_context io_;
  tcp::resolver::results_type targets_;
  Slots slots_;
  asio::steady_timer progress_timer_;
  asio::steady_timer arrival_timer_;
  asio::signal_set signals_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::set<Connection*> active_connections_;

  Clock::time_point start_, deadline_, first_sent_{}, last_end_{};
  size_t planned_dialogues_ = 0, planned_requests_ = 0, next_dialogue_ = 0;
  size_t issued_ = 0, completed_ = 0, failed_ = 0, in_flight_ = 0, active_ = 0;
  bool stopping_ = false, finished_ = false, interrupted_ = false;
  std::exception_ptr error_;
  std::vector<RequestRecord> records_;
};

// One request on its own connection; a POST when `json_body` is not empty.
awaitable<HttpResponse> one_shot(tcp::resolver::results_type targets, const Endpoint& endpoint, std::string target,
                                 std::string json_body, std::string api_key, Clock::duration timeout) {
  HttpResponse out;
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  stream.expires_after(timeout);
  if (auto [ec, ep] = co_await stream.async_connect(targets, nothrow); ec) {
    out.error = ec.message();
    co_return out;
  }
  http::request<http::string_body> req{json_body.empty() ? http::verb::get : http::verb::post, target, 11};
  req.set(http::field::host, endpoint.host + ":" + endpoint.port);
  req.set(http::field::user_agent, "moeserve-bench");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  if (!json_body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = std::move(json_body);
    req.prepare_payload();
  }
  if (auto [ec, n] = co_await http::async_write(stream, req, nothrow); ec) {
    out.error = ec.message();
    co_return out;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kWholeBodyLimit);
  if (auto [ec, n] = co_await http::async_read(stream, buffer, parser, nothrow); ec) {
    out.error = ec.message();
    co_return out;
  }
  out.status = static_cast<int>(parser.get().result_int());
  out.body = parser.get().body();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  co_return out;
}

}  // namespace

Endpoint Endpoint::parse(std::string_view url) {
  std::string_view rest = url;
  if (rest.substr(0, 8) == "https://")
    fail("{}: https is not supported; point the bench at the server's plain-HTTP port", url);
  if (rest.substr(0, 7) == "http://") rest.remove_prefix(7);
  check(rest.find("://") == std::string_view::npos, "{}: only http:// URLs are supported", url);
  Endpoint e;
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
  if (!authority.empty() && authority.front() == '[') {  // [ipv6]:port
    size_t close = authority.find(']');
    check(close != std::string_view::npos, "{}: unterminated IPv6 address", url);
    e.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size() && authority[close + 1] == ':')
      e.port = std::string(authority.substr(close + 2));
  } else {
    size_t colon = authority.rfind(':');
    e.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) e.port = std::string(authority.substr(colon + 1));
  }
  check(!e.host.empty(), "{}: no host in the URL", url);
  check(!e.port.empty() && e.port.find_first_not_of("0123456789") == std::string::npos, "{}: bad port '{}'",
        url, e.port);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.size() >= 3 && path.substr(path.size() - 3) == "/v1") path.remove_suffix(3);
  e.prefix = std::string(path);
  return e;
}

std::string Endpoint::url() const {
  bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + port + prefix;
}

namespace {

HttpResponse blocking_request(const Endpoint& endpoint, const std::string& target, std::string json_body,
                              const std::string& api_key, double timeout_s) {
  asio::io_context io;
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto targets = resolver.resolve(endpoint.host, endpoint.port, ec);
  if (ec) return {0, "", ec.message()};
  auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto future = asio::co_spawn(io, one_shot(targets, endpoint, target, std::move(json_body), api_key, timeout),
                               asio::use_future);
  io.run();
  return future.get();
}

}  // namespace

HttpResponse http_get(const Endpoint& endpoint, const std::string& target, const std::string& api_key,
                      double timeout_s) {
  return blocking_request(endpoint, target, "", api_key, timeout_s);
}

HttpResponse http_post_json(const Endpoint& endpoint, const std::string& target, const std::string& body,
                            const std::string& api_key, double timeout_s) {
  check(!body.empty(), "POST {} needs a body", target);
  return blocking_request(endpoint, target, body, api_key, timeout_s);
}

LoadResult run_load(const Endpoint& endpoint, const LoadOptions& load, const WorkloadOptions& workload,
                    const PromptGenerator& prompts, const ProgressFn& progress) {
  Runner runner(endpoint, load, workload, prompts, progress);
  return runner.run();
}

}  // namespace moeserve::loadgen
