// The router's I/O: one Asio io_context per worker thread, a coroutine per client connection, keep-alive
// pools of upstream connections per worker (as nginx keeps them per worker process), active health checks.
//
// Streaming: a response is relayed with a fixed buffer; the next upstream read starts only after the previous
// chunk was written to the client, so a slow client slows the backend through TCP flow control and memory per
// connection stays bounded. An attempt fails over to another backend only while that is safe (nothing was
// sent, the request is idempotent, or the backend refused it with 429/503); after the response head has been
// sent to the client a failure ends the response (an SSE error event and [DONE] when it is a stream).
//
// Hostile clients: a connection limit, a per-request body limit and a global budget of buffered body bytes;
// the key and HTTP framing are checked from the request head before any body byte is read; bodies the router
// reads to route are parsed with depth and size limits (parse_bounded_json).
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/bounded_json.h"
#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "router/request_info.h"
#include "router/router.h"

namespace moeserve::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;

namespace {

constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
constexpr size_t kRelayChunk = 32 * 1024;            // one read from a backend, one write to the client
constexpr size_t kUpstreamBufferLimit = 128 * 1024;  // raw bytes read ahead of the parser (head + body)
constexpr uint32_t kHeaderLimit = 64 * 1024;
// Beast reads at most the free capacity of a buffer (512 bytes at least): a small buffer would split a burst
// of SSE events into many reads and as many client writes. nginx reads into proxy_buffer_size (one page) and
// client_body_buffer_size (16 KiB).
constexpr size_t kUpstreamReadSize = 16 * 1024;
constexpr size_t kClientReadSize = 16 * 1024;
// nginx's lingering_timeout is 5 s; connections lingering at once are capped so that refused clients cannot
// use up the descriptors that requests in flight need for their backends.
constexpr Duration kLingerTime{2000};
constexpr int kMaxLingering = 256;
constexpr int kBusyRetryAfterSeconds = 1;
// After the drain's deadline: time for the streams cut short to write their last events before the router
// stops (what is still unwritten then is cut). `serve` gives its aborted requests 5 s as well.
constexpr Duration kEndingGrace{5000};
constexpr size_t kFirstEventLimit = 4096;  // bytes of a stream's first event kept for its ending
constexpr size_t kResponseIdLimit = 4096;  // bytes of a Responses API answer searched for its id

using Request = http::request<http::string_body>;
using RequestHead = http::request_header<>;
using RequestParser = http::request_parser<http::string_body>;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// POST /v1/responses (a query string aside): creates a response that a later request may continue.
bool creates_response(http::verb method, std::string_view target) {
  return method == http::verb::post && target.substr(0, target.find('?')) == "/v1/responses";
}

bool hop_by_hop(http::field name) {
  switch (name) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_connection:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade:
      return true;
    default:
      return false;
  }
}

std::string error_json(std::string_view message, std::string_view type, int code) {
  nlohmann::json body = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  // A message can quote a few bytes of what a client sent, which need not be UTF-8.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Takes time that depends on the length of the expected key only, so that response times do not tell how
// much of a guess was right.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i)
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

bool has_key(const RequestHead& head, std::string_view key) {
  constexpr std::string_view kBearer = "Bearer ";
  std::string_view auth = head[http::field::authorization];
  return auth.starts_with(kBearer) && same_secret(auth.substr(kBearer.size()), key);
}

// RFC 9110's idempotent methods: sending one again after a failure cannot do anything twice. (nginx retries
// everything but POST, LOCK and PATCH; this list is the safe side of that.)
bool replayable(http::verb method) {
  switch (method) {
    case http::verb::get:
    case http::verb::head:
    case http::verb::options:
    case http::verb::trace:
    case http::verb::put:
    case http::verb::delete_:
      return true;
    default:
      return false;
  }
}

// A read error that means the peer closed or reset the connection (as opposed to a timeout or bytes that are
// not HTTP).
bool connection_lost(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec.category() == net::error::get_system_category();
}

// Request body bytes held in memory by all connections together (--max-body-memory).
class BodyBudget {
 public:
  explicit BodyBudget(size_t limit) : limit_(limit) {}
  bool take(size_t bytes) {
    size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void give_back(size_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  size_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const size_t limit_;
  std::atomic<size_t> used_{0};
};

// One request's share of the budget: it grows with the body and is given back when the body is dropped.
class BodyHold {
 public:
  explicit BodyHold(BodyBudget& budget) : budget_(budget) {}
  ~BodyHold() { release(); }
  BodyHold(const BodyHold&) = delete;
  BodyHold& operator=(const BodyHold&) = delete;
  bool grow_to(size_t bytes) {
    if (bytes <= held_) return true;
    if (!budget_.take(bytes - held_)) return false;
    held_ = bytes;
    return true;
  }
  void release() {
    budget_.give_back(held_);
    held_ = 0;
  }

 private:
  BodyBudget& budget_;
  size_t held_ = 0;
};

// A request refused from its head: the status and what the client is told.
struct Refusal {
  http::status status;
  std::string message;
  std::string type = "invalid_request_error";
};

// RFC 9112's rules for a request head that Beast leaves to the server.
std::optional<Refusal> framing_refusal(const RequestHead& head) {
  size_t hosts = head.count(http::field::host);
  if (hosts > 1 || (hosts == 0 && head.version() >= 11))
    return Refusal{http::status::bad_request, "an HTTP/1.1 request needs exactly one Host header"};
  auto coding = head.find(http::field::transfer_encoding);  // Beast refuses a second Transfer-Encoding field
  if (coding == head.end()) return std::nullopt;
  // An HTTP/1.0 message with a transfer coding has faulty framing (RFC 9112 6.1); a coding other than chunked
  // alone would have to be decoded before the body could be read, and Beast reads only chunked.
  if (head.version() < 11)
    return Refusal{http::status::bad_request, "Transfer-Encoding in an HTTP/1.0 request"};
  if (!beast::iequals(coding->value(), "chunked"))
    return Refusal{http::status::not_implemented,
                   "no transfer coding but chunked is supported: send the body with Content-Length or "
                   "'Transfer-Encoding: chunked'"};
  return std::nullopt;
}

// Whether an idle keep-alive connection is still usable: no EOF, reset or stray bytes waiting on it.
bool idle_connection_usable(tcp::socket& socket) {
  char byte;
  ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// I/O timeouts kept lazily, as nginx keeps them: each socket has a deadline that its reads and writes move
// (a store, no system call) and its worker's watchdog looks at every socket a few times a second, cancelling
// the operation of one past its deadline; the operation then ends with beast::error::timeout. Beast's
// tcp_stream instead arms and cancels a timer around every read and write, which costs a timer-queue update
// and one more completion handler each time. A timeout fires up to one watchdog period late.
class TimedSocket;

class Watchdog {
 public:
  void add(TimedSocket* socket) {
    index_of(socket) = sockets_.size();
    sockets_.push_back(socket);
  }
  void remove(TimedSocket* socket) {
    size_t at = index_of(socket);
    sockets_[at] = sockets_.back();
    index_of(sockets_[at]) = at;
    sockets_.pop_back();
  }
  void check(Clock::time_point now);
  // Past the drain's deadline: whatever is awaited from a backend ends now, with operation_aborted rather
  // than a timeout. Clients' sockets are left alone, so that the last events still reach them.
  void cancel_backends();

 private:
  static size_t& index_of(TimedSocket* socket);
  std::vector<TimedSocket*> sockets_;
};

// A completion handler that reports a cancellation by the watchdog as a timeout; everything associated with
// the wrapped handler (executor, allocator, cancellation slot) stays associated.
template <class Handler>
struct TimeoutAware {
  Handler handler;
  const bool* expired;
  void operator()(beast::error_code ec, size_t n) {
    if (ec == net::error::operation_aborted && *expired) ec = beast::error::timeout;
    std::move(handler)(ec, n);
  }
};

}  // namespace
}  // namespace moeserve::router

template <template <typename, typename> class Associator, typename Handler, typename DefaultCandidate>
struct boost::asio::associator<Associator, moeserve::router::TimeoutAware<Handler>, DefaultCandidate>
    : Associator<Handler, DefaultCandidate> {
  static typename Associator<Handler, DefaultCandidate>::type get(
      const moeserve::router::TimeoutAware<Handler>& h) noexcept {
    return Associator<Handler, DefaultCandidate>::get(h.handler);
  }
  static auto get(const moeserve::router::TimeoutAware<Handler>& h, const DefaultCandidate& c) noexcept
      -> decltype(Associator<Handler, DefaultCandidate>::get(h.handler, c)) {
    return Associator<Handler, DefaultCandidate>::get(h.handler, c);
  }
};

namespace moeserve::router {
namespace {

// A TCP socket with a deadline, usable wherever Beast wants an AsyncStream. Lives and dies on its worker's
// thread.
class TimedSocket {
 public:
  using executor_type = tcp::socket::executor_type;
  // A client's connection, accepted.
  TimedSocket(Watchdog& watchdog, tcp::socket socket) : watchdog_(watchdog), socket_(std::move(socket)) {
    watchdog_.add(this);
  }
  // A connection to a backend, to be connected.
  TimedSocket(Watchdog& watchdog, const executor_type& executor)
      : watchdog_(watchdog), socket_(executor), to_backend_(true) {
    watchdog_.add(this);
  }
  ~TimedSocket() { watchdog_.remove(this); }
  TimedSocket(const TimedSocket&) = delete;
  TimedSocket& operator=(const TimedSocket&) = delete;

  executor_type get_executor() { return socket_.get_executor(); }
  tcp::socket& socket() { return socket_; }
  // As tcp_stream's: the deadline covers every operation until it is moved again.
  void expires_after(Duration timeout) {
    deadline_ = Clock::now() + timeout;
    expired_ = false;
  }
  void expires_never() {
    deadline_ = Clock::time_point::max();
    expired_ = false;
  }
  bool expired() const { return expired_; }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return net::async_initiate<Token, void(beast::error_code, size_t)>(
        [this](auto handler, const Buffers& b) {
          socket_.async_read_some(b, TimeoutAware<decltype(handler)>{std::move(handler), &expired_});
        },
        token, buffers);
  }
  // Beast's SyncWriteStream, for write_now() on a non-blocking socket.
  template <class Buffers>
  size_t write_some(const Buffers& buffers, beast::error_code& ec) {
    return socket_.write_some(buffers, ec);
  }
  template <class Buffers>
  size_t write_some(const Buffers& buffers) {
    return socket_.write_some(buffers);
  }

  template <class Buffers, class Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return net::async_initiate<Token, void(beast::error_code, size_t)>(
        [this](auto handler, const Buffers& b) {
          socket_.async_write_some(b, TimeoutAware<decltype(handler)>{std::move(handler), &expired_});
        },
        token, buffers);
  }

 private:
  friend class Watchdog;
  Watchdog& watchdog_;
  tcp::socket socket_;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool expired_ = false;
  bool to_backend_ = false;
  size_t index_ = 0;  // in the watchdog's list
};

size_t& Watchdog::index_of(TimedSocket* socket) {
  return socket->index_;
}

void Watchdog::check(Clock::time_point now) {
  for (TimedSocket* socket : sockets_) {
    if (socket->expired_ || now < socket->deadline_) continue;
    socket->expired_ = true;
    beast::error_code ignored;
    socket->socket_.cancel(ignored);
  }
}

void Watchdog::cancel_backends() {
  for (TimedSocket* socket : sockets_) {
    if (!socket->to_backend_) continue;
    beast::error_code ignored;
    socket->socket_.cancel(ignored);
  }
}

// How many choices a streamed request has (n per prompt), for the endings a drain's deadline writes. Most
// bodies cannot have more than one: no "n" key anywhere (a quote inside a JSON string is escaped, so the
// bytes "n" are a key) and no list of prompts. Only the others are parsed.
int64_t stream_choices(std::string_view body, bool chat) {
  auto has = [&](std::string_view text) {
    return ::memmem(body.data(), body.size(), text.data(), text.size()) != nullptr;
  };
  bool batch = false;  // a completion's "prompt": [ "..." or [ [ ...
  if (!chat) {
    if (auto at = body.find("\"prompt\""); at != std::string_view::npos) {
      size_t value = body.find_first_not_of(" \t\r\n:", at + 8);
      size_t item = value == std::string_view::npos ? value : body.find_first_not_of(" \t\r\n", value + 1);
      batch = value != std::string_view::npos && body[value] == '[' && item != std::string_view::npos &&
              (body[item] == '"' || body[item] == '[');
    }
  }
  if (!batch && !has("\"n\"")) return 1;
  auto request = parse_bounded_json_or_discarded<nlohmann::json>(body);
  if (!request.is_object()) return 1;
  int64_t n = 1, prompts = 1;
  if (auto it = request.find("n"); it != request.end() && it->is_number_integer()) n = it->get<int64_t>();
  if (auto it = request.find("prompt");
      !chat && it != request.end() && it->is_array() && !it->empty() && !it->front().is_number())
    prompts = static_cast<int64_t>(it->size());
  // The client's numbers: at most 1024 endings (serve takes n up to 128).
  return std::min<int64_t>(std::clamp<int64_t>(n, 1, 1024) * std::clamp<int64_t>(prompts, 1, 1024), 1024);
}

// How the router ends a stream it cuts short at its drain deadline, as `serve` ends one at its own: a chunk
// with finish_reason "abort" per choice, then [DONE]. The id, created and model come from the stream's first
// event, so that the client sees the ending as part of the same response. The router does not parse the
// events it relays, so a choice of several that had already finished gets the abort too, and there is no
// usage chunk.
std::string abort_ending(std::string_view first_event, int64_t choices, bool chat) {
  using Json = nlohmann::ordered_json;
  std::string_view data = first_event.substr(0, first_event.find("\n\n"));
  if (data.starts_with("data:")) data.remove_prefix(5);
  if (data.starts_with(' ')) data.remove_prefix(1);
  auto first = parse_bounded_json_or_discarded<Json>(data);
  auto field = [&](const char* name, Json fallback) {
    return first.is_object() && first.contains(name) ? first[name] : fallback;
  };
  Json chunk = {{"id", field("id", "")},
                {"object", field("object", chat ? "chat.completion.chunk" : "text_completion")},
                {"created", field("created", static_cast<int64_t>(std::time(nullptr)))},
                {"model", field("model", "")}};
  std::string out;
  for (int64_t index = 0; index < choices; ++index) {
    Json choice = {{"index", index}};
    if (chat)
      choice["delta"] = Json::object();
    else
      choice["text"] = "";
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = "abort";
    choice["stop_reason"] = nullptr;
    chunk["choices"] = Json::array({std::move(choice)});
    out += "data: " + chunk.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
  }
  return out + "data: [DONE]\n\n";
}

// Writes what `serializer` holds now (the head alone with `head_only`): directly as far as the socket takes
// it, the rest asynchronously. An asynchronous write that completes at once still completes through the
// scheduler's queue, behind a poll of epoll; most writes fit in the socket's buffer, so this saves that round
// per write. A client that reads slowly still holds the relay back: what the socket does not take waits.
// `written`, when given, gets the bytes that went out (some may have on an error).
template <bool isRequest, class Body>
awaitable<beast::error_code> write_now(TimedSocket& stream, http::serializer<isRequest, Body>& serializer,
                                       bool head_only = false, size_t* written = nullptr) {
  beast::error_code ec;
  size_t n = 0;
  if (!stream.socket().non_blocking()) stream.socket().non_blocking(true, ec);
  if (!ec) {
    if (head_only)
      n = http::write_header(stream, serializer, ec);
    else
      n = http::write(stream, serializer, ec);
  }
  if (ec == net::error::would_block || ec == net::error::try_again) {
    size_t more = 0;
    if (head_only)
      std::tie(ec, more) = co_await http::async_write_header(stream, serializer, use_tuple);
    else
      std::tie(ec, more) = co_await http::async_write(stream, serializer, use_tuple);
    n += more;
  }
  if (written != nullptr) *written = n;
  co_return ec;
}

// A connection to a backend with its read buffer: both live as long as the connection, so a request on a
// pooled connection allocates nothing for them.
struct Upstream {
  TimedSocket stream;
  beast::flat_buffer buffer{kUpstreamBufferLimit};
  Upstream(Watchdog& watchdog, const TimedSocket::executor_type& executor) : stream(watchdog, executor) {
    buffer.reserve(kUpstreamReadSize);
  }
};

struct IdleConnection {
  std::unique_ptr<Upstream> upstream;
  Clock::time_point since;
};

struct Worker {
  // Relay buffers of finished responses, reused: a fresh 32 KiB allocation per response costs a page fault
  // per page, and freeing it can shrink the heap (madvise), which flushes every core's TLB. Declared before
  // the io_context: destroying it destroys suspended requests, which give their buffers back here.
  std::vector<std::unique_ptr<char[]>> spare_chunks;
  Watchdog watchdog;  // outlives the sockets of suspended requests too
  // One thread runs it; every socket is used only from that thread, so the reactor's per-socket locks are
  // left out (the scheduler and descriptor registration keep theirs: the acceptor hands sockets over).
  net::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  net::executor_work_guard<net::io_context::executor_type> guard{ioc.get_executor()};
  std::thread thread;
  // Touched only from this worker's thread.
  std::unordered_map<int, std::deque<IdleConnection>> pools;  // backend id -> idle connections, newest last
};

// A relay buffer borrowed from the worker for one response.
class RelayChunk {
 public:
  explicit RelayChunk(Worker& worker) : worker_(worker) {
    if (worker.spare_chunks.empty()) {
      data_ = std::make_unique_for_overwrite<char[]>(kRelayChunk);
    } else {
      data_ = std::move(worker.spare_chunks.back());
      worker.spare_chunks.pop_back();
    }
  }
  ~RelayChunk() {
    if (worker_.spare_chunks.size() < kSpareChunks) worker_.spare_chunks.push_back(std::move(data_));
  }
  RelayChunk(const RelayChunk&) = delete;
  RelayChunk& operator=(const RelayChunk&) = delete;
  char* data() { return data_.get(); }
  static constexpr size_t size() { return kRelayChunk; }

 private:
  static constexpr size_t kSpareChunks = 256;  // 8 MiB per worker at most
  Worker& worker_;
  std::unique_ptr<char[]> data_;
};

// `failed`: the attempt failed after the request may have reached the backend, so it is not sent to another
// one (nginx's proxy_next_upstream without non_idempotent); the client gets `status`.
enum class AttemptEnd { delivered, client_gone, retry, failed };

struct AttemptResult {
  AttemptEnd end = AttemptEnd::retry;
  bool client_reusable = false;
  std::string reason;  // why it failed
  http::status status = http::status::bad_gateway;
};

// What a client's request brings to each attempt on a backend: proxy() makes it once.
struct ClientRequest {
  Request& request;  // rewritten for each backend (target, Host)
  BodyHold& hold;    // the body's share of the memory budget, released once a backend has the response
  const std::string& original_target;
  const RouteRequest& route;
  bool keep_alive = false;
  unsigned version = 11;
};

// A backend's part in one attempt, settled with the balancer once, on whichever exit the attempt takes: the
// outcome (which ends the backend's in-flight count) and the response it gave (its status, or "error" when
// none came; latencies < 0 when not measured).
class BackendTurn {
 public:
  BackendTurn(Balancer& balancer, const Selection& selection) : balancer_(balancer), selection_(selection) {}
  void settle(Outcome outcome, std::string_view reason, std::string_view status, double ttfb_seconds,
              double total_seconds) {
    if (settled_) return;
    settled_ = true;
    balancer_.finish(selection_, outcome, reason);
    balancer_.record_response(*selection_.backend, status, ttfb_seconds, total_seconds);
  }

 private:
  Balancer& balancer_;
  const Selection& selection_;
  bool settled_ = false;
};

// How reading a request body ended.
enum class BodyEnd { complete, too_large, over_budget, timed_out, malformed, gone };

}  // namespace

struct Router::Impl {
  RouterConfig config;
  std::shared_ptr<const KeyEncoder> encoder;
  Balancer balancer;
  BodyBudget body_budget;
  std::vector<std::unique_ptr<Worker>> workers;
  std::optional<tcp::acceptor> acceptor;
  uint16_t bound_port = 0;
  std::atomic<size_t> next_worker{0};
  std::atomic<int> active_requests{0};
  std::atomic<int> connections{0};  // client connections open
  std::atomic<int> lingering{0};    // connections in close_lingering
  std::atomic<bool> draining{false};
  // The drain's deadline has passed: every worker's watchdog cancels whatever is awaited from a backend,
  // streams end with finish_reason "abort", requests without a response yet get a 503.
  std::atomic<bool> ending{false};
  std::atomic<bool> stopping{false};
  std::mutex join_mu;

  Impl(RouterConfig c, std::shared_ptr<const KeyEncoder> e, std::function<TimePoint()> clock)
      : config(std::move(c)),
        encoder(e ? std::move(e) : make_key_encoder(config.tokenizer)),
        balancer(config, std::move(clock)),
        body_budget(config.max_body_memory) {}

  // ---- client side ------------------------------------------------------------------------------------

  awaitable<void> accept_loop() {
    while (!stopping) {
      Worker& target = *workers[next_worker++ % workers.size()];
      auto [ec, socket] = co_await acceptor->async_accept(target.ioc, use_tuple);
      if (ec) {
        if (!acceptor->is_open() || ec == net::error::operation_aborted) co_return;
        // Out of file descriptors or similar: back off instead of spinning.
        spdlog::warn("route: accept failed: {}", ec.message());
        net::steady_timer pause(acceptor->get_executor(), std::chrono::milliseconds(50));
        co_await pause.async_wait(use_tuple);
        continue;
      }
      // Only this coroutine adds connections, so the check and the increment cannot race with another.
      if (connections.load() >= config.max_connections) {
        net::co_spawn(target.ioc, refuse_connection(target, std::move(socket)), net::detached);
        continue;
      }
      ++connections;
      net::co_spawn(target.ioc, session(target, std::move(socket)), net::detached);
    }
  }

  // Over --max-connections: a 503 at once, before reading anything (as uvicorn's --limit-concurrency does).
  awaitable<void> refuse_connection(Worker& worker, tcp::socket socket) {
    TimedSocket client(worker.watchdog, std::move(socket));
    co_await send_local(
        client, http::status::service_unavailable, 11, false,
        error_json(fmt::format("the router has {} client connections open (--max-connections); "
                               "retry shortly",
                               config.max_connections),
                   "server_busy", 503),
        "application/json", kBusyRetryAfterSeconds);
    co_await close_lingering(client);
  }

  // nginx's lingering close, for a connection given up with part of its request unread: stop sending, then
  // read and drop what the client still sends, for up to kLingerTime, before closing. Closing with unread
  // bytes would make the kernel reset the connection, which can destroy the answer before the client read it.
  awaitable<void> close_lingering(TimedSocket& client) {
    beast::error_code ignored;
    client.socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (lingering.fetch_add(1) < kMaxLingering) {
      client.expires_after(kLingerTime);
      std::array<char, 4096> scratch;
      for (;;) {
        auto [ec, n] = co_await client.async_read_some(net::buffer(scratch), use_tuple);
        if (ec) break;
      }
    }
    --lingering;
  }

  awaitable<void> session(Worker& worker, tcp::socket socket) {
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::string client_address = socket.remote_endpoint(ignored).address().to_string();
    TimedSocket client(worker.watchdog, std::move(socket));
    beast::flat_buffer buffer;
    buffer.reserve(kClientReadSize);
    try {
      for (;;) {
        RequestParser parser;
        parser.header_limit(kHeaderLimit);
        parser.body_limit(config.max_body_bytes);
        client.expires_after(config.client_header_timeout);
        auto [ec, n] = co_await http::async_read_header(client, buffer, parser, use_tuple);
        if (ec == http::error::body_limit) {  // a Content-Length over the limit is refused before the body
          co_await send_local(client, http::status::payload_too_large, 11, false, body_too_large());
          co_await close_lingering(client);
          break;
        }
        if (ec == http::error::header_limit) {
          co_await send_local(client, http::status::request_header_fields_too_large, 11, false,
                              error_json(fmt::format("request head over {} bytes", kHeaderLimit),
                                         "invalid_request_error", 431));
          co_await close_lingering(client);
          break;
        }
        if (ec) {
          if (ec != beast::error::timeout && !connection_lost(ec)) {
            co_await send_local(
                client, http::status::bad_request, 11, false,
                error_json(fmt::format("malformed request: {}", ec.message()), "invalid_request_error", 400));
            co_await close_lingering(client);
          }
          break;
        }
        const RequestHead& head = parser.get();
        unsigned version = head.version();
        // Everything that can refuse a request is decided from its head, before a byte of its body is read
        // or held: framing, key, body budget.
        std::optional<Refusal> refusal = framing_refusal(head);
        if (!refusal) refusal = access_refusal(head);
        BodyHold hold(body_budget);
        if (auto length = parser.content_length(); !refusal && length && !hold.grow_to(*length))
          refusal = over_budget();
        if (refusal) {
          // A request without a body can be refused on a connection that stays open; with one, the connection
          // closes, as the unread body is in the way.
          bool reusable = co_await send_local(
              client, refusal->status, version, parser.is_done() && parser.keep_alive(),
              error_json(refusal->message, refusal->type, static_cast<int>(refusal->status)),
              "application/json",
              refusal->status == http::status::service_unavailable ? kBusyRetryAfterSeconds : 0);
          if (reusable) continue;
          if (!parser.is_done()) co_await close_lingering(client);
          break;
        }
        if (beast::iequals(head[http::field::expect], "100-continue") && !parser.is_done()) {
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          co_await net::async_write(client, net::buffer(kContinue), use_tuple);
        }
        BodyEnd end = co_await read_body(client, buffer, parser, hold);
        if (end != BodyEnd::complete) {
          if (end == BodyEnd::too_large) {
            co_await send_local(client, http::status::payload_too_large, version, false, body_too_large());
          } else if (end == BodyEnd::over_budget) {
            Refusal busy = over_budget();
            co_await send_local(client, busy.status, version, false, error_json(busy.message, busy.type, 503),
                                "application/json", kBusyRetryAfterSeconds);
          } else if (end == BodyEnd::malformed) {
            co_await send_local(
                client, http::status::bad_request, version, false,
                error_json("malformed request body (bad chunked encoding)", "invalid_request_error", 400));
          } else if (end == BodyEnd::timed_out) {  // nginx answers a client_body_timeout with 408 as well
            co_await send_local(client, http::status::request_timeout, version, false,
                                error_json("the request body did not arrive within --client-header-timeout",
                                           "invalid_request_error", 408));
          }
          if (end != BodyEnd::gone && end != BodyEnd::timed_out) co_await close_lingering(client);
          break;
        }
        Request request = parser.release();
        bool keep_alive = request.keep_alive();
        ++active_requests;
        bool reusable = co_await handle(worker, client, request, hold, client_address);
        --active_requests;
        if (!reusable || !keep_alive || draining) break;
      }
    } catch (const std::exception& e) {
      spdlog::error("route: connection from {} ended by an internal error: {}", client_address, e.what());
    }
    client.socket().shutdown(tcp::socket::shutdown_both, ignored);
    client.socket().close(ignored);
    --connections;
  }

  // Reads the rest of a body whose head was read, holding its bytes in the budget as they arrive (a chunked
  // body has no length to hold up front).
  awaitable<BodyEnd> read_body(TimedSocket& client, beast::flat_buffer& buffer, RequestParser& parser,
                               BodyHold& hold) {
    beast::error_code ec;
    for (;;) {
      // Bytes already received (usually the whole body came with the head) are parsed at once rather than
      // through another asynchronous read, which would complete through the scheduler's queue (one more
      // epoll_wait).
      while (!parser.is_done() && buffer.size() > 0) {
        size_t used = parser.put(buffer.data(), ec);
        buffer.consume(used);
        if (ec == http::error::need_more) ec = {};
        if (ec || used == 0) break;
      }
      if (!ec && !hold.grow_to(parser.get().body().capacity())) co_return BodyEnd::over_budget;
      if (ec || parser.is_done()) break;
      size_t n = 0;
      std::tie(ec, n) = co_await http::async_read_some(client, buffer, parser, use_tuple);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) break;
    }
    if (!ec) co_return BodyEnd::complete;
    if (ec == http::error::body_limit) co_return BodyEnd::too_large;
    if (ec == beast::error::timeout) co_return BodyEnd::timed_out;
    if (connection_lost(ec)) co_return BodyEnd::gone;
    co_return BodyEnd::malformed;
  }

  std::string body_too_large() const {
    return error_json(fmt::format("request body over the router's limit of {} bytes (--max-body-size)",
                                  config.max_body_bytes),
                      "invalid_request_error", 413);
  }

  Refusal over_budget() const {
    return Refusal{http::status::service_unavailable,
                   fmt::format("the router holds {} bytes of request bodies already (--max-body-memory); "
                               "retry shortly",
                               config.max_body_memory),
                   "server_busy"};
  }

  // A response the router writes itself. Returns whether the connection may serve another request.
  awaitable<bool> send_local(TimedSocket& client, http::status status, unsigned version, bool keep_alive,
                             std::string body, std::string_view content_type = "application/json",
                             int retry_after_seconds = 0) {
    http::response<http::string_body> res{status, version == 10 ? 10u : 11u};
    res.set(http::field::server, "moeserve-route");
    res.set(http::field::content_type, content_type);
    if (retry_after_seconds > 0) res.set(http::field::retry_after, std::to_string(retry_after_seconds));
    res.keep_alive(keep_alive && !draining);
    res.body() = std::move(body);
    res.prepare_payload();
    balancer.count_client_response(static_cast<int>(status));
    client.expires_after(config.send_timeout);
    http::response_serializer<http::string_body> serializer{res};
    beast::error_code ec = co_await write_now(client, serializer);
    co_return !ec && res.keep_alive();
  }

  // Who may make a request, from its head alone. The router's own read-only pages and a backend's health and
  // version are open (as on `moeserve serve`); the admin calls take the admin key; everything else the API
  // key.
  std::optional<Refusal> access_refusal(const RequestHead& head) const {
    std::string_view target = head.target();
    std::string_view path = target.substr(0, target.find('?'));
    if (path.starts_with("/backends/")) {
      const std::string& key = config.admin_key.empty() ? config.api_key : config.admin_key;
      if (key.empty())
        return Refusal{http::status::forbidden,
                       "admin calls are disabled: start the router with --admin-key KEY (or --api-key KEY)",
                       "permission_error"};
      if (!has_key(head, key))
        return Refusal{http::status::unauthorized, "missing or wrong admin key", "authentication_error"};
      return std::nullopt;
    }
    if (config.api_key.empty()) return std::nullopt;
    bool read_only = head.method() == http::verb::get || head.method() == http::verb::head;
    if (read_only && (path == "/health" || path == "/v1/health" || path == "/metrics" || path == "/version" ||
                      path == "/backends"))
      return std::nullopt;
    if (!has_key(head, config.api_key))
      return Refusal{http::status::unauthorized,
                     "missing or wrong API key (send 'Authorization: Bearer KEY')", "authentication_error"};
    return std::nullopt;
  }

  awaitable<bool> handle(Worker& worker, TimedSocket& client, Request& request, BodyHold& hold,
                         const std::string& client_address) {
    std::string_view target = request.target();
    std::string_view path = target.substr(0, target.find('?'));
    unsigned version = request.version();
    bool keep_alive = request.keep_alive();
    bool get = request.method() == http::verb::get;

    if (get && path == "/health") {
      int available = 0;
      for (const auto& b : balancer.backends()) available += balancer.available(*b) ? 1 : 0;
      bool ok = !draining && available > 0;
      nlohmann::json body = {{"status", draining ? "draining" : (ok ? "ok" : "no_backend")},
                             {"backends_available", available}};
      co_return co_await send_local(client, ok ? http::status::ok : http::status::service_unavailable,
                                    version, keep_alive, body.dump());
    }
    if (get && path == "/metrics") {
      co_return co_await send_local(client, http::status::ok, version, keep_alive, metrics_text(),
                                    "text/plain; version=0.0.4; charset=utf-8");
    }
    if (get && path == "/backends") {
      co_return co_await send_local(client, http::status::ok, version, keep_alive,
                                    balancer.describe().dump(2));
    }
    if (path.starts_with("/backends/")) co_return co_await admin(client, request, path);
    if (draining) {  // a request on a connection kept alive from before the drain
      co_return co_await send_local(
          client, http::status::service_unavailable, version, false,
          error_json("the router is shutting down and accepts no new requests", "service_unavailable", 503));
    }

    if (get && path == "/v1/models") {
      auto cards = balancer.model_cards();
      if (!cards.empty()) {
        std::string body = R"({"object":"list","data":[)";
        for (size_t i = 0; i < cards.size(); ++i) body += (i ? "," : "") + cards[i];
        body += "]}";
        co_return co_await send_local(client, http::status::ok, version, keep_alive, std::move(body));
      }
    }
    co_return co_await proxy(worker, client, request, hold, client_address);
  }

  // The balancer's page and the router's own connection and memory gauges.
  std::string metrics_text() const {
    MetricsRegistry registry;
    balancer.export_metrics(registry);
    registry.gauge("moeserve_router_client_connections", "Client connections open (--max-connections).")
        .set(static_cast<double>(connections.load()));
    registry
        .gauge("moeserve_router_request_body_bytes", "Request body bytes held in memory (--max-body-memory).")
        .set(static_cast<double>(body_budget.used()));
    return registry.render();
  }

  // The key was checked from the request head (access_refusal).
  awaitable<bool> admin(TimedSocket& client, Request& request, std::string_view path) {
    unsigned version = request.version();
    bool keep_alive = request.keep_alive();
    if (request.method() != http::verb::post) {
      co_return co_await send_local(client, http::status::method_not_allowed, version, keep_alive,
                                    error_json("use POST", "invalid_request_error", 405));
    }
    auto body = parse_bounded_json_or_discarded<nlohmann::json>(request.body());
    auto url_field = body.is_object() ? body.find("url") : body.end();
    auto weight_field = body.is_object() ? body.find("weight") : body.end();
    if (url_field == body.end() || !url_field->is_string() ||
        (weight_field != body.end() && !weight_field->is_number_integer())) {
      co_return co_await send_local(
          client, http::status::bad_request, version, keep_alive,
          error_json(
              "body must be {\"url\": \"http://host:port\"} (and for add, optionally an integer \"weight\")",
              "invalid_request_error", 400));
    }
    std::string url = url_field->get<std::string>();
    std::string action(path.substr(std::string_view("/backends/").size()));
    bool done = false;
    std::string message;
    std::string invalid;
    try {
      if (action == "add") {
        BackendSpec spec;
        spec.url = url;
        int64_t weight = weight_field == body.end() ? 1 : weight_field->get<int64_t>();
        check(weight >= 1 && weight <= 1'000'000, "weight must be 1..1000000");
        spec.weight = static_cast<int>(weight);
        auto added = balancer.add(spec);
        done = added != nullptr;
        message = done ? "added" : "already present";
        if (added) net::co_spawn(workers[0]->ioc, health_check(added), net::detached);
      } else if (action == "drain") {
        done = balancer.drain(url);
        message = done ? "draining: no new requests, in-flight ones finish" : "unknown backend";
      } else if (action == "remove") {
        done = balancer.remove(url);
        message = done ? "removed" : "unknown backend";
      } else {
        invalid = "unknown admin action (use /backends/add, /backends/drain or /backends/remove)";
      }
    } catch (const Error& e) {
      invalid = e.what();
    }
    if (!invalid.empty()) {
      co_return co_await send_local(client, http::status::bad_request, version, keep_alive,
                                    error_json(invalid, "invalid_request_error", 400));
    }
    if (done) spdlog::info("route: admin {} {}", action, url);
    nlohmann::json reply = {{"url", url}, {"result", message}};
    co_return co_await send_local(client, done ? http::status::ok : http::status::conflict, version,
                                  keep_alive,
                                  reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }

  // ---- proxying -----------------------------------------------------------------------------------------

  awaitable<bool> proxy(Worker& worker, TimedSocket& client, Request& request, BodyHold& hold,
                        const std::string& client_address) {
    bool client_keep_alive = request.keep_alive();
    unsigned client_version = request.version();
    BodyNeeds needs;
    needs.key = config.policy == Policy::cache_aware;
    needs.session = config.session_affinity;
    needs.model = balancer.serves_several_models();
    needs.response = creates_response(request.method(), request.target());
    std::string_view session_header;
    if (auto it = request.find("X-Session-ID"); it != request.end()) session_header = it->value();
    RouteRequest route;
    std::string invalid;
    try {
      route = describe_request(request.body(), session_header, needs, *encoder);
    } catch (const JsonParseError& e) {
      invalid = fmt::format("the request body is not valid JSON: {}", e.what());
    }
    if (!invalid.empty()) {
      co_return co_await send_local(client, http::status::bad_request, client_version, client_keep_alive,
                                    error_json(invalid, "invalid_request_error", 400));
    }
    // A stored response read, listed, deleted or cancelled: the node that made it holds it.
    if (auto id = response_id_in_path(request.target())) route.previous_response = std::move(*id);

    std::string original_target(request.target());
    for (auto field :
         {http::field::connection, http::field::keep_alive, http::field::proxy_connection, http::field::te,
          http::field::trailer, http::field::transfer_encoding, http::field::upgrade, http::field::expect})
      request.erase(field);
    std::string forwarded(request["X-Forwarded-For"]);
    request.set("X-Forwarded-For", forwarded.empty() ? client_address : forwarded + ", " + client_address);
    request.version(11);
    request.keep_alive(true);
    request.prepare_payload();

    ClientRequest client_request{request, hold, original_target, route, client_keep_alive, client_version};
    std::vector<int> tried;
    std::string last_error = "no backend is available (all ejected, unhealthy, draining or busy)";
    for (int attempt = 0; attempt <= config.retries; ++attempt) {
      auto selection = balancer.pick(route, tried);
      if (!selection) break;
      tried.push_back(selection->backend->id);
      bool may_retry = attempt < config.retries;
      AttemptResult result =
          co_await attempt_on(worker, *selection, client, client_request, tried, may_retry);
      if (result.end == AttemptEnd::delivered) co_return result.client_reusable&& client_keep_alive;
      if (result.end == AttemptEnd::client_gone) co_return false;
      if (ending) {  // the drain's deadline cancelled the attempt: no other backend gets the request
        co_return co_await send_local(client, http::status::service_unavailable, client_version, false,
                                      error_json("the router is shutting down; the request was not completed",
                                                 "service_unavailable", 503));
      }
      last_error = fmt::format("backend {}: {}", selection->backend->url, result.reason);
      if (result.end == AttemptEnd::failed) {
        spdlog::warn("route: {} failed on {}, not sent to another backend", original_target, last_error);
        co_return co_await send_local(
            client, result.status, client_version, client_keep_alive,
            error_json(fmt::format("{}; the request was not sent to another backend, as the first may have "
                                   "processed it (or been brought down by it)",
                                   last_error),
                       "server_error", static_cast<int>(result.status)));
      }
      balancer.count_retry(result.reason);
      spdlog::debug("route: retrying {} elsewhere after {}", original_target, last_error);
    }
    std::string message =
        tried.empty() ? last_error
                      : fmt::format("no backend could serve the request after {} attempt(s); last: {}",
                                    tried.size(), last_error);
    co_return co_await send_local(
        client, tried.empty() ? http::status::service_unavailable : http::status::bad_gateway, client_version,
        client_keep_alive, error_json(message, "server_error", tried.empty() ? 503 : 502), "application/json",
        tried.empty() ? kBusyRetryAfterSeconds : 0);
  }

  awaitable<std::unique_ptr<Upstream>> connect(Worker& worker, const BackendAddress& address,
                                               Duration timeout, std::string& error) {
    auto upstream = std::make_unique<Upstream>(worker.watchdog, co_await net::this_coro::executor);
    upstream->stream.expires_after(timeout);
    std::vector<tcp::endpoint> endpoints;
    beast::error_code ec;
    if (auto ip = net::ip::make_address(address.host, ec); !ec) {
      endpoints.emplace_back(ip, address.port);  // an address needs no resolver (a thread per io_context)
    } else {
      tcp::resolver resolver(co_await net::this_coro::executor);
      auto [rec, results] =
          co_await resolver.async_resolve(address.host, std::to_string(address.port), use_tuple);
      if (rec) {
        error = "cannot resolve " + address.host + ": " + rec.message();
        co_return nullptr;
      }
      for (const auto& entry : results) endpoints.push_back(entry.endpoint());
      if (endpoints.empty()) {
        error = "cannot resolve " + address.host + ": no address";
        co_return nullptr;
      }
    }
    tcp::socket& socket = upstream->stream.socket();
    for (const auto& endpoint : endpoints) {
      if (socket.is_open()) socket.close(ec);
      std::tie(ec) = co_await socket.async_connect(endpoint, use_tuple);
      if (!ec) break;
      if (upstream->stream.expired()) {
        error = "connect timeout";
        co_return nullptr;
      }
    }
    if (ec) {
      error = "connect failed: " + ec.message();
      co_return nullptr;
    }
    upstream->stream.expires_never();
    socket.set_option(tcp::no_delay(true), ec);
    co_return upstream;
  }

  std::unique_ptr<Upstream> take_idle(Worker& worker, int backend_id) {
    auto it = worker.pools.find(backend_id);
    if (it == worker.pools.end()) return nullptr;
    auto& idle = it->second;
    auto now = Clock::now();
    while (!idle.empty()) {
      IdleConnection connection = std::move(idle.back());
      idle.pop_back();
      if (now - connection.since >= config.keepalive_timeout) continue;
      // A backend may have closed an idle connection (its own keep-alive timeout, or after a response without
      // saying so), so each is checked first (a system call): a POST that met such a close after it was sent
      // could not be sent again, as the close would look the same as the backend dying on it.
      if (idle_connection_usable(connection.upstream->stream.socket())) return std::move(connection.upstream);
    }
    return nullptr;
  }

  void put_idle(Worker& worker, int backend_id, std::unique_ptr<Upstream> upstream) {
    if (config.keepalive <= 0) return;
    auto& idle = worker.pools[backend_id];
    upstream->stream.expires_never();
    idle.push_back({std::move(upstream), Clock::now()});
    // nginx `keepalive N`: at most N idle connections per worker; the least recently used are closed.
    while (idle.size() > static_cast<size_t>(config.keepalive)) idle.pop_front();
  }

  awaitable<void> watch_timeouts(Worker& worker) {
    // A quarter of the shortest timeout, between 10 and 250 ms (nginx's timers are 300 ms lazy).
    Duration shortest = std::min(
        {config.client_header_timeout, config.read_timeout, config.send_timeout, config.connect_timeout});
    if (config.health_interval.count() > 0) shortest = std::min(shortest, config.health_timeout);
    auto period = std::clamp<Duration>(shortest / 4, Duration(10), Duration(250));
    net::steady_timer timer(worker.ioc);
    while (!stopping) {
      timer.expires_after(period);
      co_await timer.async_wait(use_tuple);
      worker.watchdog.check(Clock::now());
      // Again each period: an operation started after the first cancellation ends too.
      if (ending) worker.watchdog.cancel_backends();
    }
  }

  awaitable<void> sweep_idle(Worker& worker) {
    net::steady_timer timer(worker.ioc);
    auto period = std::clamp<Duration>(config.keepalive_timeout / 4, Duration(100), Duration(10'000));
    while (!stopping) {
      timer.expires_after(period);
      co_await timer.async_wait(use_tuple);
      auto now = Clock::now();
      for (auto& [id, idle] : worker.pools)
        std::erase_if(idle, [&](IdleConnection& c) {
          return now - c.since >= config.keepalive_timeout ||
                 !idle_connection_usable(c.upstream->stream.socket());
        });
    }
  }

  awaitable<AttemptResult> attempt_on(Worker& worker, const Selection& selection, TimedSocket& client,
                                      ClientRequest& client_request, const std::vector<int>& tried,
                                      bool may_retry) {
    Request& request = client_request.request;
    const std::string& original_target = client_request.original_target;
    Backend& backend = *selection.backend;
    BackendTurn turn(balancer, selection);
    auto started = Clock::now();
    request.target(backend.address.prefix + original_target);
    request.set(http::field::host, backend.address.host_header);
    bool may_resend = replayable(request.method());

    auto fail_attempt = [&](std::string reason, Outcome outcome = Outcome::failure) {
      turn.settle(outcome, reason, "error", -1, -1);
      return AttemptResult{AttemptEnd::retry, false, std::move(reason)};
    };
    // The request may have reached the backend, and it is not idempotent: it goes nowhere else. A backend
    // that closed the connection on it may have crashed on it, and one request must not bring down every
    // backend it is retried on.
    auto fail_for_good = [&](std::string reason, Outcome outcome, http::status status) {
      AttemptResult result = fail_attempt(std::move(reason), outcome);
      result.end = AttemptEnd::failed;
      result.status = status;
      return result;
    };

    std::unique_ptr<Upstream> upstream;
    std::optional<http::response_parser<http::buffer_body>> parser;
    // A pooled connection can have been closed by the backend an instant ago (the keep-alive race); when the
    // request can safely go again, that is no failure of the backend and it goes again on a fresh connection
    // to the same backend.
    for (;;) {
      upstream = take_idle(worker, backend.id);
      bool reused = upstream != nullptr;
      if (!reused) {
        std::string error;
        upstream = co_await connect(worker, backend.address, config.connect_timeout, error);
        if (!upstream) co_return fail_attempt(error);  // nothing was sent: any backend may take it
      }
      upstream->stream.expires_after(config.send_timeout);
      http::request_serializer<http::string_body> request_writer{request};
      size_t written = 0;
      beast::error_code wec = co_await write_now(upstream->stream, request_writer, false, &written);
      // The drain's deadline cancelled it: no failure of the backend's (proxy() answers 503).
      if (wec && ending) co_return fail_attempt("the router's shutdown deadline passed", Outcome::neutral);
      if (wec) {
        bool timed_out = wec == beast::error::timeout;
        std::string reason = timed_out ? "send timeout" : "send failed: " + wec.message();
        // The backend can only have died on the request if some of it went out.
        Outcome outcome = timed_out || written == 0 ? Outcome::failure : Outcome::died;
        if (written == 0 || may_resend) {
          if (reused) continue;
          co_return fail_attempt(reason, outcome);
        }
        co_return fail_for_good(reason + " (after part of the request went out)", outcome,
                                timed_out ? http::status::gateway_timeout : http::status::bad_gateway);
      }
      parser.emplace();
      parser->header_limit(kHeaderLimit);
      parser->body_limit(boost::none);
      if (request.method() == http::verb::head) parser->skip(true);
      upstream->buffer.clear();
      upstream->stream.expires_after(config.read_timeout);
      auto [rec, rn] =
          co_await http::async_read_header(upstream->stream, upstream->buffer, *parser, use_tuple);
      if (rec && ending) co_return fail_attempt("the router's shutdown deadline passed", Outcome::neutral);
      if (rec) {
        bool timed_out = rec == beast::error::timeout;
        bool lost = !timed_out && connection_lost(rec);
        if (may_resend && reused && upstream->buffer.size() == 0 && lost) continue;
        Outcome outcome = lost ? Outcome::died : Outcome::failure;
        std::string reason;
        if (timed_out)
          reason = fmt::format("no response within {} ms (--read-timeout)", config.read_timeout.count());
        else if (lost)
          reason =
              "closed the connection after the request was sent, before any response (" + rec.message() + ")";
        else
          reason = "malformed response: " + rec.message();
        if (may_resend) co_return fail_attempt(reason, outcome);
        co_return fail_for_good(reason, outcome,
                                timed_out ? http::status::gateway_timeout : http::status::bad_gateway);
      }
      break;
    }
    upstream->stream.expires_never();
    beast::flat_buffer& buffer = upstream->buffer;
    double ttfb = seconds_since(started);
    auto& head = parser->get();
    int status = head.result_int();
    auto status_reason = [status] { return fmt::format("status {}", status); };

    // 429 and 503 say that the backend did not take the request; a 502 or 504 from a backend that is itself a
    // proxy may mean that its own upstream died on it, so only an idempotent request goes again after one.
    bool refused = status == 429 || status == 503;
    bool gateway_error = status == 502 || status == 504;
    if ((refused || (gateway_error && may_resend)) && may_retry &&
        balancer.can_route(client_request.route, tried)) {
      if (status == 429) {
        if (auto wait = parse_retry_after(head[http::field::retry_after]))
          balancer.retry_after(backend, Duration(static_cast<int64_t>(*wait * 1000)));
        turn.settle(Outcome::neutral, "", std::to_string(status), ttfb, seconds_since(started));
      } else {
        turn.settle(Outcome::failure, status_reason(), std::to_string(status), ttfb, seconds_since(started));
      }
      co_return AttemptResult{AttemptEnd::retry, false, status_reason()};
    }
    bool event_stream = head[http::field::content_type].starts_with("text/event-stream");
    // A response the backend created: its id is learned before the client has the answer, so that the
    // request continuing it (previous_response_id) comes back here.
    bool learn_id = status / 100 == 2 && creates_response(request.method(), original_target);
    std::string answer_head;
    bool chat = original_target.find("/chat/") != std::string::npos;
    int64_t choices = event_stream ? stream_choices(request.body(), chat) : 1;  // for a drain's ending
    // The response is committed to this backend from here on: nothing will send the body again, so its memory
    // goes back to the budget now rather than when a stream ends minutes later.
    request.body() = std::string();
    client_request.hold.release();
    Outcome outcome = (status == 502 || status == 503 || status == 504) ? Outcome::failure : Outcome::success;
    if (status == 429) outcome = Outcome::neutral;
    // The backend's part is over: release it (before the last bytes go out, as nginx does, so that a client
    // that sends its next request at once already sees the backend's in-flight count without this one).
    auto release_backend = [&] {
      turn.settle(outcome, outcome == Outcome::failure ? status_reason() : std::string(),
                  std::to_string(status), ttfb, seconds_since(started));
      if (parser->keep_alive() && buffer.size() == 0) put_idle(worker, backend.id, std::move(upstream));
    };

    http::response<http::buffer_body> response{head.result(), client_request.version == 10 ? 10u : 11u};
    response.reason(head.reason());
    for (const auto& field : head)
      if (!hop_by_hop(field.name())) response.insert(field.name_string(), field.value());
    bool no_body =
        request.method() == http::verb::head || status / 100 == 1 || status == 204 || status == 304;
    // HTTP/1.0 has no chunked coding (RFC 9112 7.1): without a length, the body ends with the connection.
    bool ends_with_close = false;
    if (!no_body) {
      if (auto length = parser->content_length())
        response.content_length(*length);
      else if (client_request.version >= 11)
        response.chunked(true);
      else
        ends_with_close = true;
    }
    response.keep_alive(client_request.keep_alive && !draining && !ends_with_close);
    http::response_serializer<http::buffer_body> serializer{response};
    balancer.count_client_response(status);

    auto client_gone = [&]() {
      turn.settle(Outcome::neutral, "", std::to_string(status), ttfb, -1);
      return AttemptResult{AttemptEnd::client_gone, false, {}};
    };

    if (no_body) {
      release_backend();
      client.expires_after(config.send_timeout);
      beast::error_code hec = co_await write_now(client, serializer, true);
      co_return AttemptResult{AttemptEnd::delivered, !hec, {}};
    }

    // Moves what the parser can take from bytes already received into the relay buffer, without waiting.
    std::string failure;
    Outcome failure_outcome = Outcome::failure;
    auto parse_received = [&] {
      while (!parser->is_done() && buffer.size() > 0 && parser->get().body().size > 0) {
        beast::error_code pec;
        size_t used = parser->put(buffer.data(), pec);
        buffer.consume(used);
        if (pec == http::error::need_more || pec == http::error::need_buffer || used == 0) break;
        if (pec) {
          failure = "malformed response body: " + pec.message();
          break;
        }
      }
    };

    RelayChunk chunk(worker);
    // What the client has of an event stream: how it began and its last two bytes (whether it stopped between
    // events), so that the stream can be ended properly at the drain's deadline.
    std::string first_event;
    char relayed_tail[2] = {'\n', '\n'};
    // The head goes out with the body bytes that came with it, in one write; alone when none came yet (nginx
    // does the same), so that a client sees the head of a stream whose first event takes a while.
    bool head_sent = false;
    for (;;) {
      parser->get().body().data = chunk.data();
      parser->get().body().size = chunk.size();
      if (!head_sent) {
        parse_received();
        if (failure.empty() && !parser->is_done() && parser->get().body().size == chunk.size()) {
          // Nothing came with the head, but the first event is often right behind it (a server writes the
          // head and the first event separately): take what has arrived since, without waiting, so that the
          // client gets both in one write and wakes up once.
          tcp::socket& socket = upstream->stream.socket();
          beast::error_code rec;
          if (!socket.non_blocking()) socket.non_blocking(true, rec);
          size_t room = std::min(kUpstreamReadSize, buffer.max_size() - buffer.size());
          size_t n = rec || room == 0 ? 0 : socket.read_some(buffer.prepare(room), rec);
          buffer.commit(n);
          parse_received();
        }
      } else if (!parser->is_done()) {  // an empty body (Content-Length: 0) is complete with the head
        // At the drain's deadline a stream ends between two events; in the middle of one, the rest of it is
        // read first (a backend writes an event at once; the watchdog cancels this read soon all the same).
        if (ending && event_stream && relayed_tail[0] == '\n' && relayed_tail[1] == '\n') {
          failure = "the router's shutdown deadline passed";
          break;
        }
        // Each side's timer runs only while that side is awaited, so that a slow client is never taken for a
        // slow backend (a failure counted against it) and the reverse.
        upstream->stream.expires_after(config.read_timeout);
        auto [rec, rn] = co_await http::async_read_some(upstream->stream, buffer, *parser, use_tuple);
        if (rec == http::error::need_buffer) rec = {};
        if (rec) {
          failure = ending                         ? "the router's shutdown deadline passed"
                    : rec == beast::error::timeout ? "read timeout mid-response"
                                                   : "backend closed mid-response";
          if (!ending && connection_lost(rec)) failure_outcome = Outcome::died;
          break;
        }
        upstream->stream.expires_never();
        // Parse whatever else has already arrived (often several SSE chunks) into the same buffer, so that
        // the client gets them in one write instead of one write per upstream chunk.
        parse_received();
      }
      if (!failure.empty()) break;
      size_t got = chunk.size() - parser->get().body().size;
      bool upstream_done = parser->is_done();
      if (upstream_done) {
        release_backend();
      } else if (got == 0) {
        if (!head_sent) {
          client.expires_after(config.send_timeout);
          beast::error_code hec = co_await write_now(client, serializer, true);
          if (hec) co_return client_gone();
          client.expires_never();
          head_sent = true;
        }
        continue;
      }
      if (learn_id && got > 0) {
        answer_head.append(chunk.data(), std::min(got, kResponseIdLimit - answer_head.size()));
        if (auto id = response_id_in(answer_head)) {
          balancer.learn_response(*id, backend.id);
          learn_id = false;
        } else if (answer_head.size() == kResponseIdLimit) {
          learn_id = false;
        }
      }
      if (event_stream && got > 0) {
        if (first_event.empty()) first_event.assign(chunk.data(), std::min(got, kFirstEventLimit));
        relayed_tail[0] = got > 1 ? chunk.data()[got - 2] : relayed_tail[1];
        relayed_tail[1] = chunk.data()[got - 1];
      }
      response.body().data = got ? chunk.data() : nullptr;
      response.body().size = got;
      response.body().more = !upstream_done;
      client.expires_after(config.send_timeout);
      beast::error_code wec = co_await write_now(client, serializer);
      if (wec == http::error::need_buffer) wec = {};
      if (upstream_done) co_return AttemptResult{AttemptEnd::delivered, !wec && !ends_with_close, {}};
      if (wec) co_return client_gone();
      client.expires_never();
      head_sent = true;
    }
    // The backend failed after the client got part of the response: no retry is possible any more. Or the
    // drain's deadline ended it, which is no failure of the backend's.
    bool cut_short = ending;
    if (cut_short)
      spdlog::info("route: ending {} from {} at the shutdown deadline", original_target, backend.url);
    else
      spdlog::warn("route: backend {} failed mid-response for {}: {}", backend.url, original_target, failure);
    turn.settle(cut_short ? Outcome::neutral : failure_outcome, cut_short ? "" : failure,
                std::to_string(status), ttfb, seconds_since(started));
    if (event_stream && (response.chunked() || ends_with_close)) {
      std::string event;
      if (cut_short) {
        // A partial event is closed first (a broken event, but the ones after it parse).
        if (relayed_tail[1] != '\n') event = "\n";
        if (relayed_tail[0] != '\n' || relayed_tail[1] != '\n') event += "\n";
        event += abort_ending(first_event, choices, chat);
      } else {
        // As vLLM ends a stream that failed: an error event, then [DONE], so that a client waiting for the
        // end of the stream gets it.
        event = "data: " +
                error_json(fmt::format("backend {}: {}; the response is incomplete", backend.url, failure),
                           "server_error", 502) +
                "\n\ndata: [DONE]\n\n";
      }
      response.body().data = event.data();
      response.body().size = event.size();
      response.body().more = false;
      client.expires_after(config.send_timeout);
      co_await write_now(client, serializer);
    }
    co_return AttemptResult{AttemptEnd::delivered, false, {}};
  }

  // ---- health checks -----------------------------------------------------------------------------------

  // One GET on an open connection; nullopt when it failed.
  awaitable<std::optional<http::response<http::string_body>>> fetch(TimedSocket& stream,
                                                                    const Backend& backend,
                                                                    std::string target) {
    Request request{http::verb::get, backend.address.prefix + target, 11};
    request.set(http::field::host, backend.address.host_header);
    request.set(http::field::user_agent, "moeserve-route-health");
    if (!config.api_key.empty()) request.set(http::field::authorization, "Bearer " + config.api_key);
    request.keep_alive(true);
    stream.expires_after(config.health_timeout);
    auto [wec, wn] = co_await http::async_write(stream, request, use_tuple);
    if (wec) co_return std::nullopt;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(8 << 20);
    auto [rec, rn] = co_await http::async_read(stream, buffer, parser, use_tuple);
    if (rec) co_return std::nullopt;
    co_return parser.release();
  }

  awaitable<void> health_check(std::shared_ptr<Backend> backend) {
    std::string error;
    auto stream = co_await connect(*workers[0], backend->address, config.health_timeout, error);
    bool ok = false;
    if (stream) {
      auto health = co_await fetch(stream->stream, *backend, config.health_path);
      ok = health && health->result_int() / 100 == 2;
      if (ok) {
        if (auto models = co_await fetch(stream->stream, *backend, "/v1/models");
            models && models->result_int() == 200) {
          auto doc = parse_bounded_json_or_discarded<nlohmann::json>(models->body());
          if (doc.is_object() && doc.contains("data") && doc["data"].is_array()) {
            std::vector<std::string> ids, cards;
            for (const auto& card : doc["data"]) {
              if (!card.is_object() || !card.contains("id") || !card["id"].is_string()) continue;
              ids.push_back(card["id"]);
              cards.push_back(card.dump());
            }
            balancer.set_models(*backend, std::move(ids), std::move(cards));
          }
        }
        if (auto metrics = co_await fetch(stream->stream, *backend, "/metrics");
            metrics && metrics->result_int() == 200) {
          ReportedLoad load = parse_reported_load(metrics->body());
          balancer.set_reported_load(*backend, load.requests, load.kv_usage);
        }
      }
    }
    if (!ok)
      spdlog::debug("route: health check of {} failed{}", backend->url, error.empty() ? "" : ": " + error);
    balancer.health_result(*backend, ok);
  }

  awaitable<void> health_loop() {
    net::steady_timer timer(workers[0]->ioc);
    while (!stopping) {
      for (const auto& backend : balancer.backends())
        net::co_spawn(workers[0]->ioc, health_check(backend), net::detached);
      timer.expires_after(config.health_interval);
      co_await timer.async_wait(use_tuple);
    }
  }

  // ---- lifecycle -----------------------------------------------------------------------------------------

  void start() {
    size_t count = config.workers > 0 ? config.workers : std::max(1u, std::thread::hardware_concurrency());
    for (size_t i = 0; i < count; ++i) workers.push_back(std::make_unique<Worker>());
    beast::error_code ec;
    auto address = net::ip::make_address(config.host == "localhost" ? "127.0.0.1" : config.host, ec);
    check(!ec, "--host '{}' is not an IP address", config.host);
    tcp::endpoint endpoint(address, config.port);
    acceptor.emplace(workers[0]->ioc);
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(net::socket_base::max_listen_connections, ec);
    check(!ec, "cannot listen on {}:{}: {}", config.host, config.port, ec.message());
    bound_port = acceptor->local_endpoint().port();

    net::co_spawn(workers[0]->ioc, accept_loop(), net::detached);
    if (config.health_interval.count() > 0) net::co_spawn(workers[0]->ioc, health_loop(), net::detached);
    for (auto& worker : workers) {
      net::co_spawn(worker->ioc, sweep_idle(*worker), net::detached);
      net::co_spawn(worker->ioc, watch_timeouts(*worker), net::detached);
      worker->thread = std::thread([w = worker.get()] { w->ioc.run(); });
    }
  }

  void drain() {
    if (draining.exchange(true)) return;
    spdlog::info("route: draining: {} request(s) in flight, up to {} ms to finish", active_requests.load(),
                 config.shutdown_timeout.count());
    net::post(workers[0]->ioc, [this] {
      beast::error_code ignored;
      acceptor->close(ignored);
    });
    net::co_spawn(workers[0]->ioc, drain_then_stop(), net::detached);
  }

  // Requests in flight finish until the deadline (or end_in_flight); those left then end properly, with a
  // grace to write their last events, and the router stops.
  awaitable<void> drain_then_stop() {
    net::steady_timer timer(workers[0]->ioc);
    auto wait_while = [&](auto more) -> awaitable<void> {
      while (active_requests > 0 && more()) {
        timer.expires_after(std::chrono::milliseconds(50));
        co_await timer.async_wait(use_tuple);
      }
    };
    auto deadline = Clock::now() + config.shutdown_timeout;
    co_await wait_while([&] { return Clock::now() < deadline && !ending; });
    if (active_requests > 0) {
      spdlog::info("route: ending {} request(s) still in flight (finish_reason \"abort\")",
                   active_requests.load());
      ending = true;
      for (auto& worker : workers)
        net::post(worker->ioc, [w = worker.get()] { w->watchdog.cancel_backends(); });
      auto grace = Clock::now() + kEndingGrace;
      co_await wait_while([&] { return Clock::now() < grace; });
    }
    stop();
  }

  void end_in_flight() {
    drain();
    ending = true;
  }

  void stop() {
    stopping = true;
    for (auto& worker : workers) {
      worker->guard.reset();
      worker->ioc.stop();
    }
  }

  void wait() {
    std::lock_guard lock(join_mu);
    for (auto& worker : workers)
      if (worker->thread.joinable()) worker->thread.join();
  }
};

Router::Router(RouterConfig config, std::shared_ptr<const KeyEncoder> encoder,
               std::function<TimePoint()> clock)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(encoder), std::move(clock))) {}

Router::~Router() {
  impl_->stop();
  impl_->wait();
}

void Router::start() {
  impl_->start();
}
uint16_t Router::port() const {
  return impl_->bound_port;
}
void Router::drain() {
  impl_->drain();
}
void Router::end_in_flight() {
  impl_->end_in_flight();
}
void Router::stop() {
  impl_->stop();
}
void Router::wait() {
  impl_->wait();
}
Balancer& Router::balancer() {
  return impl_->balancer;
}

namespace {

// A proxied request holds two descriptors (client and backend), and idle upstream connections are pooled
// besides: the soft limit on open files (1024 on Debian) would run out long before --max-connections, so it
// is raised towards the hard one, as an operator would with nginx's worker_rlimit_nofile.
void raise_open_file_limit(const RouterConfig& config) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  rlim_t wanted = 2 * static_cast<rlim_t>(config.max_connections) + 1024;
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = std::min(wanted, limit.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur < wanted)
    spdlog::warn("route: open files are limited to {} (ulimit -n); --max-connections {} needs about {}",
                 limit.rlim_cur, config.max_connections, wanted);
}

}  // namespace

int run_router(const RouterConfig& config, std::shared_ptr<const KeyEncoder> encoder) {
  raise_open_file_limit(config);
  // The signals are ours before the first connection is: a SIGTERM right after the router answered its first
  // request must drain it, not find the default action (seen as exit 143 on a loaded machine).
  net::io_context signals_context;
  net::signal_set signals(signals_context, SIGINT, SIGTERM);
  Router router(config, std::move(encoder));
  router.start();
  spdlog::info("route: listening on http://{}:{} — policy {}, {} backend(s), max_fails={} fail_timeout={}ms",
               config.host, router.port(), policy_name(config.policy), config.backends.size(),
               config.max_fails, config.fail_timeout.count());
  int received = 0;
  std::function<void(const beast::error_code&, int)> on_signal = [&](const beast::error_code& ec, int) {
    if (ec) return;
    // As `serve`: the first signal drains, the second moves the deadline to now (streams still end properly);
    // a third stops at once.
    if (++received == 1)
      router.drain();
    else if (received == 2)
      router.end_in_flight();
    else
      router.stop();
    if (received < 3) signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  std::thread waiter([&] {
    router.wait();
    signals_context.stop();
  });
  signals_context.run();
  waiter.join();
  spdlog::info("route: stopped");
  return 0;
}

}  // namespace moeserve::router
