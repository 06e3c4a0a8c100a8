// The only translation unit of the server that includes Boost.Beast/Asio (about 30 s to compile).
// One coroutine per connection, running on its own strand; handlers run on a thread pool the coroutine
// awaits. See http.h for the response model.
#include <sys/socket.h>

// GCC 12 reports the optional<Head> inside AsyncBody::Step, held across co_await in write_deferred, as
// "may be used uninitialized": a known false positive of its coroutine-frame analysis.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "server/api_error.h"
#include "server/http.h"

namespace moeserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
constexpr auto kNoThrow = net::as_tuple(net::use_awaitable);

std::string_view HttpRequest::header(std::string_view name) const {
  for (auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

namespace {

// A share of the global budget of buffered request-body bytes, given back when the request is done with.
class BodyCharge {
 public:
  explicit BodyCharge(std::atomic<size_t>& used) : used_(&used) {}
  BodyCharge(BodyCharge&& o) noexcept : used_(o.used_), bytes_(std::exchange(o.bytes_, 0)) {}
  BodyCharge& operator=(BodyCharge&&) = delete;
  ~BodyCharge() { used_->fetch_sub(bytes_); }

  // Charges n more bytes unless the total would pass `budget`; false (and nothing charged) when it would.
  bool add(uint64_t n, size_t budget) {
    size_t now = used_->load();
    do {
      if (n > budget - std::min(now, budget)) return false;
    } while (!used_->compare_exchange_weak(now, now + n));
    bytes_ += n;
    return true;
  }

 private:
  std::atomic<size_t>* used_;
  size_t bytes_ = 0;
};

using Parser = http::request_parser<http::string_body>;

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  Handler handler;
  // The counters come before the io_context: coroutine frames still pending when it is destroyed release
  // into them.
  std::atomic<size_t> active{0};
  std::atomic<size_t> connections{0};
  std::atomic<size_t> body_bytes{0};
  std::atomic<size_t> pool_work{0};  // handlers queued or running on the pool
  std::atomic<bool> stopping{false};
  std::atomic<bool> stopped{false};
  net::io_context ioc;
  std::optional<net::thread_pool> pool;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;

  Impl(HttpServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)), ioc(options.threads) {}

  net::awaitable<void> accept_loop();
  net::awaitable<void> session(tcp::socket socket);
  // True when the whole body is in the parser; otherwise the exchange is over (answered, or the peer left).
  net::awaitable<bool> read_body(beast::tcp_stream& stream, beast::flat_buffer& buffer, Parser& parser,
                                 BodyCharge& charge);
  // The handler's reply, from the worker pool unless the request runs inline.
  net::awaitable<Reply> dispatch(HttpRequest request, BodyCharge charge);
  // Not a coroutine: built inside one, GCC 12 destroyed the lambda's captures twice (a double free).
  net::awaitable<Reply> on_pool(HttpRequest&& request, BodyCharge&& charge);
  Reply call_handler(HttpRequest& request);
  // These two return false when the connection cannot carry another request: a write failed, or the body was
  // ended by closing the connection.
  net::awaitable<bool> write_response(beast::tcp_stream& stream, HttpResponse&& r, bool keep_alive,
                                      unsigned version);
  net::awaitable<bool> write_deferred(beast::tcp_stream& stream, std::shared_ptr<AsyncBody> body,
                                      Headers extra, bool keep_alive, unsigned version);
  net::awaitable<void> lingering_close(beast::tcp_stream& stream);
  // An error the HTTP layer answers itself; the connection closes after it, without reading what is left.
  net::awaitable<void> refuse(beast::tcp_stream& stream, HttpResponse&& r) {
    if (options.on_protocol_error) options.on_protocol_error(r.status);
    co_await write_response(stream, std::move(r), false, 11);
    co_await lingering_close(stream);
  }
};

namespace {

// RAII count of things in progress (connections, responses), so limits and stop() can see them.
struct Counted {
  std::atomic<size_t>& n;
  const size_t before;  // the count without this one
  explicit Counted(std::atomic<size_t>& n) : n(n), before(n.fetch_add(1)) {}
  ~Counted() { --n; }
};

// The request without its body: what HeadCheck and runs_inline see.
HttpRequest head_of(const http::request<http::string_body>& msg, const std::string& remote) {
  HttpRequest r;
  r.method = std::string(msg.method_string());
  std::string_view target = msg.target();
  size_t q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
  for (auto& field : msg) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers.emplace_back(std::move(name), std::string(field.value()));
  }
  r.remote = remote;
  return r;
}

// The framing rules of RFC 9112 that Beast leaves to the application: the error to answer instead of reading
// the body, if the request breaks one. Beast takes "gzip" or "chunked, gzip" as a request without a body and
// would read that body as the next request, so every Transfer-Encoding but a lone "chunked" is refused.
std::optional<HttpResponse> framing_error(const http::request<http::string_body>& msg) {
  const size_t hosts = msg.count(http::field::host);
  if (hosts > 1)
    return error_response(400, "the request has more than one Host header (RFC 9112 section 3.2)");
  if (hosts == 0 && msg.version() >= 11) {
    return error_response(400, "an HTTP/1.1 request needs a Host header (RFC 9112 section 3.2)");
  }
  std::vector<std::string> codings;
  bool has_transfer_encoding = false;
  auto [first, last] = msg.equal_range(http::field::transfer_encoding);
  for (auto it = first; it != last; ++it) {
    has_transfer_encoding = true;
    std::string_view list = it->value();
    for (size_t start = 0; start <= list.size();) {
      size_t comma = std::min(list.find(',', start), list.size());
      std::string_view item = list.substr(start, comma - start);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
      std::string coding(item);
      for (char& c : coding) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (!coding.empty()) codings.push_back(std::move(coding));
      start = comma + 1;
    }
  }
  if (!has_transfer_encoding) return std::nullopt;
  if (msg.version() < 11) {
    return error_response(400,
                          "Transfer-Encoding in an HTTP/1.0 request: its framing cannot be trusted "
                          "(RFC 9112 section 6.1)");
  }
  const auto chunked = std::count(codings.begin(), codings.end(), "chunked");
  if (codings.size() == 1 && chunked == 1) return std::nullopt;
  if (chunked == 1 && codings.back() == "chunked") {
    return error_response(501,
                          "only the chunked transfer coding is supported: send the body with "
                          "'Transfer-Encoding: chunked' alone, or with a Content-Length");
  }
  return error_response(400,
                        "Transfer-Encoding must end in a single 'chunked': the body's length cannot be "
                        "determined (RFC 9112 section 6.3)");
}

// 503 with Retry-After: a limit of this server, not the request's fault.
HttpResponse unavailable(const std::string& message) {
  ApiError e(503, message, "service_unavailable");
  e.retry_after_s = 1;
  return error_response(e);
}

// HTTP/1.0 keeps a connection only when the response says so (RFC 9112 section 9.3); HTTP/1.1's default is
// to keep it, so Beast writes no token then.
template <class Message>
void set_connection(Message& m, bool keep_alive, unsigned version) {
  m.keep_alive(keep_alive);
  if (keep_alive && version < 11) m.set(http::field::connection, "keep-alive");
}

// Runs fn() on the pool and resumes the awaiting coroutine on its own executor (the connection's strand). The
// work guard keeps the IO threads running meanwhile, also when no socket operation is pending.
template <typename Fn>
net::awaitable<Reply> run_on(net::thread_pool& pool, Fn fn) {
  return net::async_initiate<decltype(net::use_awaitable), void(Reply)>(
      [&pool](auto handler, Fn fn) {
        auto back = net::make_work_guard(net::get_associated_executor(handler));
        net::post(pool, [handler = std::move(handler), fn = std::move(fn), back = std::move(back)]() mutable {
          Reply reply = fn();
          net::post(back.get_executor(), [handler = std::move(handler), reply = std::move(reply)]() mutable {
            std::move(handler)(std::move(reply));
          });
        });
      },
      net::use_awaitable, std::move(fn));
}

// The client went away or stalled past a timeout: nothing to answer.
bool peer_left(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::operation_aborted;
}

// True when the peer has closed its side (EOF or reset). Data waiting means a pipelined request: not closed.
bool peer_closed(tcp::socket& socket) {
  char byte;
  ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

HttpResponse body_too_large(size_t limit) {
  return error_response(413, fmt::format("the request body exceeds the limit of {} bytes", limit));
}

}  // namespace

net::awaitable<void> HttpServer::Impl::accept_loop() {
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(net::make_strand(ioc), kNoThrow);
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) co_return;
      // Out of file descriptors and the like: back off briefly rather than spin.
      spdlog::warn("http: accept failed: {}", ec.message());
      net::steady_timer t(ioc, std::chrono::milliseconds(50));
      co_await t.async_wait(kNoThrow);
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto ex = socket.get_executor();
    net::co_spawn(ex, session(std::move(socket)), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        spdlog::error("http: connection failed: {}", x.what());
      }
    });
  }
}

net::awaitable<bool> HttpServer::Impl::write_response(beast::tcp_stream& stream, HttpResponse&& r,
                                                      bool keep_alive, unsigned version) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
  res.set(http::field::server, options.server_header);
  if (!r.content_type.empty()) res.set(http::field::content_type, r.content_type);
  for (auto& [k, v] : r.headers) res.set(k, v);
  set_connection(res, keep_alive, version);
  res.body() = std::move(r.body);
  res.prepare_payload();
  stream.expires_after(options.write_timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kNoThrow);
  co_return !ec;
}

net::awaitable<bool> HttpServer::Impl::write_deferred(beast::tcp_stream& stream,
                                                      std::shared_ptr<AsyncBody> body, Headers extra,
                                                      bool keep_alive, unsigned version) {
  auto ex = co_await net::this_coro::executor;
  auto timer = std::make_shared<net::steady_timer>(ex);
  auto woken = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<net::steady_timer> weak_timer = timer;
  body->start([ex, weak_timer, woken] {
    if (woken->exchange(true)) return;  // a wake-up is already on its way
    net::post(ex, [weak_timer] {
      if (auto t = weak_timer.lock()) t->cancel();
    });
  });

  // Watch for the client going away while we wait for output, so the generation is cancelled promptly
  // instead of at the next write.
  auto gone = std::make_shared<bool>(false);
  auto watching = std::make_shared<bool>(false);
  auto watch = [&stream, gone, watching, weak_timer] {
    if (*watching || *gone) return;
    *watching = true;
    stream.socket().async_wait(tcp::socket::wait_read, [&stream, gone, watching, weak_timer](auto ec) {
      *watching = false;
      if (ec) return;
      if (peer_closed(stream.socket())) {
        *gone = true;
        if (auto t = weak_timer.lock()) t->cancel();
      }
      // otherwise: a pipelined request is waiting; it is read after this response.
    });
  };
  auto finish = [&](bool ok) {
    if (*watching) {
      beast::error_code ignored;
      stream.socket().cancel(ignored);
    }
    if (!ok) body->cancel();
    return ok;
  };

  bool head_sent = false;
  bool streaming = false;
  // HTTP/1.0 has no chunked coding (RFC 9112 section 7): a stream to such a client goes out as it is and ends
  // when the connection closes.
  bool close_delimited = false;
  AsyncBody::Head head;
  std::string whole;  // not streaming: the body accumulates until done
  for (;;) {
    woken->store(false);
    AsyncBody::Step step = body->poll(Clock::now());
    if (step.head && !head_sent) {
      head = std::move(*step.head);
      head.headers.insert(head.headers.end(), extra.begin(), extra.end());
      streaming = head.chunked;
      close_delimited = streaming && version < 11;
      if (streaming) {
        http::response<http::empty_body> res{static_cast<http::status>(head.status), 11};
        res.set(http::field::server, options.server_header);
        if (!head.content_type.empty()) res.set(http::field::content_type, head.content_type);
        for (auto& [k, v] : head.headers) res.set(k, v);
        set_connection(res, keep_alive && !close_delimited, version);
        if (!close_delimited) res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        stream.expires_after(options.write_timeout);
        auto [ec, n] = co_await http::async_write_header(stream, sr, kNoThrow);
        if (ec) co_return finish(false);
      }
      head_sent = true;
    }
    if (!step.data.empty()) {
      if (streaming) {
        stream.expires_after(options.write_timeout);
        beast::error_code ec;
        if (close_delimited) {
          std::tie(ec, std::ignore) = co_await net::async_write(stream, net::buffer(step.data), kNoThrow);
        } else {
          std::tie(ec, std::ignore) =
              co_await net::async_write(stream, http::make_chunk(net::buffer(step.data)), kNoThrow);
        }
        if (ec) co_return finish(false);
      } else {
        whole += step.data;
      }
    }
    if (step.done) {
      if (close_delimited) {
        finish(true);
        co_return false;  // the close ends the body
      }
      if (streaming) {
        stream.expires_after(options.write_timeout);
        auto [ec, n] = co_await net::async_write(stream, http::make_chunk_last(), kNoThrow);
        co_return finish(!ec);
      }
      HttpResponse r{head.status, head.content_type, std::move(head.headers), std::move(whole)};
      bool ok = co_await write_response(stream, std::move(r), keep_alive, version);
      co_return finish(ok);
    }
    if (*gone) co_return finish(false);
    if (woken->load()) continue;
    watch();
    timer->expires_at(step.wake_at ? *step.wake_at : Clock::time_point::max());
    co_await timer->async_wait(kNoThrow);
    if (*gone) co_return finish(false);
  }
}

net::awaitable<void> HttpServer::Impl::lingering_close(beast::tcp_stream& stream) {
  // Closing with unread request bytes makes the kernel send RST, which can destroy the error response before
  // the client reads it. Half-close, then discard what the client still sends for a short while.
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.expires_after(std::chrono::seconds(2));
  char sink[16384];
  size_t discarded = 0;
  while (discarded < (64u << 20)) {
    auto [rec, n] = co_await stream.async_read_some(net::buffer(sink), kNoThrow);
    if (rec) break;
    discarded += n;
  }
  stream.socket().close(ec);
}

net::awaitable<void> HttpServer::Impl::session(tcp::socket socket) {
  Counted open(connections);
  std::string remote;
  {
    beast::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    if (!ec) remote = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  beast::tcp_stream stream(std::move(socket));
  if (open.before >= options.max_connections) {
    // Answered rather than left in the listen backlog, so the client learns why and may retry elsewhere.
    co_await refuse(stream,
                    unavailable(fmt::format("the server is at its limit of {} connections; retry shortly",
                                            options.max_connections)));
    co_return;
  }
  beast::flat_buffer buffer;
  bool first = true;
  for (;;) {
    Parser parser;
    parser.header_limit(static_cast<uint32_t>(options.max_header_bytes));
    // The body's size is checked once the head hook has seen the request (read_body), so an unauthenticated
    // client gets its 401 whatever it announces.
    parser.body_limit(boost::none);
    // An idle keep-alive connection may wait longer than a client that has started a request.
    stream.expires_after(first || buffer.size() > 0 ? options.header_timeout : options.keep_alive_timeout);
    first = false;
    auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, kNoThrow);
    if (ec) {
      if (peer_left(ec)) break;
      // Computed apart from the co_await: GCC 12 destroys a conditional's temporary twice inside one.
      HttpResponse error = ec == http::error::header_limit
                               ? error_response(431, "request headers are too large")
                               : error_response(400, "malformed HTTP request: " + ec.message());
      co_await refuse(stream, std::move(error));
      co_return;
    }

    auto& msg = parser.get();
    const unsigned version = msg.version();
    const bool has_body = !parser.is_done();
    if (auto error = framing_error(msg)) {
      co_await refuse(stream, std::move(*error));
      co_return;
    }
    HttpRequest request = head_of(msg, remote);
    if (options.on_head) {
      if (auto early = options.on_head(request)) {
        // Answered from the head: a body still to come is not read, so the connection cannot go on.
        const bool keep_alive = !has_body && msg.keep_alive() && !stopping.load();
        bool ok = co_await write_response(stream, std::move(*early), keep_alive, version);
        if (has_body) {
          if (ok) co_await lingering_close(stream);
          co_return;
        }
        if (!ok || !keep_alive) break;
        continue;
      }
    }
    BodyCharge charge(body_bytes);
    if (has_body && !co_await read_body(stream, buffer, parser, charge)) co_return;

    const bool keep_alive = msg.keep_alive() && !stopping.load();
    request.body = std::move(msg.body());
    // In progress for stop() and active_responses() from the dispatch until the response is written, a
    // streamed body's end included. Counted in the handler and in the stream apart, a request was briefly
    // in neither between them, and a stop() then closed its connection before the first byte.
    Counted in_progress(active);
    Reply reply = co_await dispatch(std::move(request), std::move(charge));
    bool ok;
    if (reply.body) {
      ok = co_await write_deferred(stream, std::move(reply.body), std::move(reply.headers), keep_alive,
                                   version);
    } else {
      auto& h = reply.response.headers;
      h.insert(h.end(), reply.headers.begin(), reply.headers.end());
      ok = co_await write_response(stream, std::move(reply.response), keep_alive, version);
    }
    if (!ok || !keep_alive) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.socket().close(ec);
}

net::awaitable<bool> HttpServer::Impl::read_body(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                                 Parser& parser, BodyCharge& charge) {
  const size_t budget = options.max_buffered_body_bytes;
  auto over_budget = [&] {
    return unavailable(
        fmt::format("the server holds its limit of {} bytes of request bodies; retry shortly", budget));
  };
  // An announced length is checked and charged whole, before a byte of the body is read.
  if (auto length = parser.content_length()) {
    if (*length > options.max_body_bytes) {
      co_await refuse(stream, body_too_large(options.max_body_bytes));
      co_return false;
    }
    if (!charge.add(*length, budget)) {
      co_await refuse(stream, over_budget());
      co_return false;
    }
  }
  parser.body_limit(options.max_body_bytes);
  // A chunked body is charged chunk by chunk, as each chunk's size arrives and before its data does.
  bool budget_exhausted = false;
  auto on_chunk = [&](uint64_t size, beast::string_view, beast::error_code& ec) {
    if (!charge.add(size, budget)) {
      budget_exhausted = true;
      ec = net::error::no_buffer_space;
    }
  };
  if (parser.chunked()) parser.on_chunk_header(on_chunk);

  // curl and others wait for "100 Continue" before sending bodies over 1 KiB.
  if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
    http::response<http::empty_body> cont{http::status::continue_, 11};
    stream.expires_after(options.write_timeout);
    auto [ec, n] = co_await http::async_write(stream, cont, kNoThrow);
    if (ec) co_return false;
  }
  stream.expires_after(options.header_timeout);
  auto [ec, n] = co_await http::async_read(stream, buffer, parser, kNoThrow);
  if (!ec) co_return true;
  if (budget_exhausted) {
    co_await refuse(stream, over_budget());
  } else if (ec == http::error::body_limit) {
    co_await refuse(stream, body_too_large(options.max_body_bytes));
  } else if (!peer_left(ec) && ec != http::error::partial_message) {
    co_await refuse(stream, error_response(400, "malformed HTTP request: " + ec.message()));
  }
  co_return false;
}

net::awaitable<Reply> HttpServer::Impl::dispatch(HttpRequest request, BodyCharge charge) {
  if (!pool || (options.runs_inline && options.runs_inline(request))) co_return call_handler(request);
  if (pool_work.fetch_add(1) >= size_t(options.worker_threads) + options.max_queued_work) {
    --pool_work;
    if (options.on_protocol_error) options.on_protocol_error(503);
    co_return Reply{
        unavailable(fmt::format("the server is busy: {} requests wait to be processed; retry shortly",
                                options.max_queued_work)),
        nullptr};
  }
  co_return co_await on_pool(std::move(request), std::move(charge));
}

net::awaitable<Reply> HttpServer::Impl::on_pool(HttpRequest&& request, BodyCharge&& charge) {
  return run_on(*pool, [this, request = std::move(request), charge = std::move(charge)]() mutable {
    Reply reply = call_handler(request);
    --pool_work;
    return reply;
  });
}

Reply HttpServer::Impl::call_handler(HttpRequest& request) {
  Reply reply;
  try {
    reply = handler(request);
  } catch (const ApiError& e) {
    reply.response = error_response(e);
  } catch (const std::exception& e) {
    spdlog::error("http: handler failed on {} {}: {}", request.method, request.path, e.what());
    reply.response = error_response(500, std::string("internal error: ") + e.what());
  }
  return reply;
}

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  auto& o = impl_->options;
  beast::error_code ec;
  auto address = net::ip::make_address(o.host, ec);
  check(!ec, "--host {}: not an IP address ({})", o.host, ec.message());
  tcp::endpoint endpoint(address, o.port);
  tcp::acceptor acceptor(impl_->ioc);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  check(!ec, "cannot listen on {}:{}: {}", o.host, o.port, ec.message());
  impl_->bound_port = acceptor.local_endpoint().port();
  impl_->acceptor.emplace(std::move(acceptor));
  if (o.worker_threads > 0) impl_->pool.emplace(static_cast<size_t>(o.worker_threads));
  net::co_spawn(impl_->ioc, impl_->accept_loop(), net::detached);
  for (int i = 0; i < std::max(1, o.threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
}

uint16_t HttpServer::port() const {
  return impl_->bound_port;
}

size_t HttpServer::active_responses() const {
  return impl_->active.load();
}

size_t HttpServer::open_connections() const {
  return impl_->connections.load();
}

size_t HttpServer::buffered_body_bytes() const {
  return impl_->body_bytes.load();
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  if (impl_->stopped.exchange(true)) return;
  impl_->stopping = true;
  if (impl_->acceptor) {
    net::post(impl_->ioc, [this] {
      beast::error_code ec;
      impl_->acceptor->close(ec);
    });
  }
  auto deadline = Clock::now() + grace;
  while (impl_->active.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // The close posted above may not have run before the io_context stopped (nothing in progress: no wait),
  // and a listening socket left open goes on completing connections in the kernel that nobody answers.
  if (impl_->acceptor) {
    beast::error_code ec;
    impl_->acceptor->close(ec);
  }
  // After the IO threads: a handler finishing now posts its reply to a stopped io_context, where it is
  // dropped.
  if (impl_->pool) {
    impl_->pool->stop();
    impl_->pool->join();
  }
}

}  // namespace moeserve::server
