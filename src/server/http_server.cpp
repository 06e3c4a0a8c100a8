// The only translation unit of the server that includes Boost.Beast/Asio (about 30 s to compile).
// One coroutine per connection, running on its own strand; see http.h for the response model.
#include <sys/socket.h>

// GCC 12 reports the optional<Head> inside AsyncBody::Step, held across co_await in write_deferred, as
// "may be used uninitialized": a known false positive of its coroutine-frame analysis.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
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

struct HttpServer::Impl {
  HttpServerOptions options;
  Handler handler;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<size_t> active{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stopped{false};
  uint16_t bound_port = 0;

  Impl(HttpServerOptions o, Handler h) : options(std::move(o)), handler(std::move(h)), ioc(options.threads) {}

  net::awaitable<void> accept_loop();
  net::awaitable<void> session(tcp::socket socket);
  net::awaitable<bool> write_response(beast::tcp_stream& stream, HttpResponse&& r, bool keep_alive);
  net::awaitable<bool> write_deferred(beast::tcp_stream& stream, std::shared_ptr<AsyncBody> body,
                                      bool keep_alive);
  net::awaitable<void> lingering_close(beast::tcp_stream& stream);
  // An error the HTTP layer answers itself; the connection closes after it.
  net::awaitable<void> reject(beast::tcp_stream& stream, HttpResponse&& r) {
    if (options.on_protocol_error) options.on_protocol_error(r.status);
    co_await write_response(stream, std::move(r), false);
  }
};

namespace {

// RAII count of responses in progress, so stop() can wait for them.
struct ActiveGuard {
  std::atomic<size_t>& n;
  explicit ActiveGuard(std::atomic<size_t>& n) : n(n) { ++n; }
  ~ActiveGuard() { --n; }
};

HttpRequest to_request(http::request<http::string_body>&& msg, const std::string& remote) {
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
  r.body = std::move(msg.body());
  r.remote = remote;
  return r;
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
                                                      bool keep_alive) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
  res.set(http::field::server, options.server_header);
  if (!r.content_type.empty()) res.set(http::field::content_type, r.content_type);
  for (auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = std::move(r.body);
  res.prepare_payload();
  stream.expires_after(options.write_timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kNoThrow);
  co_return !ec;
}

net::awaitable<bool> HttpServer::Impl::write_deferred(beast::tcp_stream& stream, std::shared_ptr<AsyncBody> body,
                                                      bool keep_alive) {
  ActiveGuard guard(active);
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
  bool chunked = false;
  AsyncBody::Head head;
  std::string whole;  // non-chunked: the body accumulates until done
  for (;;) {
    woken->store(false);
    AsyncBody::Step step = body->poll(Clock::now());
    if (step.head && !head_sent) {
      head = std::move(*step.head);
      chunked = head.chunked;
      if (chunked) {
        http::response<http::empty_body> res{static_cast<http::status>(head.status), 11};
        res.set(http::field::server, options.server_header);
        if (!head.content_type.empty()) res.set(http::field::content_type, head.content_type);
        for (auto& [k, v] : head.headers) res.set(k, v);
        res.keep_alive(keep_alive);
        res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        stream.expires_after(options.write_timeout);
        auto [ec, n] = co_await http::async_write_header(stream, sr, kNoThrow);
        if (ec) co_return finish(false);
      }
      head_sent = true;
    }
    if (!step.data.empty()) {
      if (chunked) {
        stream.expires_after(options.write_timeout);
        auto [ec, n] = co_await net::async_write(stream, http::make_chunk(net::buffer(step.data)), kNoThrow);
        if (ec) co_return finish(false);
      } else {
        whole += step.data;
      }
    }
    if (step.done) {
      if (chunked) {
        stream.expires_after(options.write_timeout);
        auto [ec, n] = co_await net::async_write(stream, http::make_chunk_last(), kNoThrow);
        co_return finish(!ec);
      }
      HttpResponse r{head.status, head.content_type, std::move(head.headers), std::move(whole)};
      bool ok = co_await write_response(stream, std::move(r), keep_alive);
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
  std::string remote;
  {
    beast::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    if (!ec) remote = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  bool first = true;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(options.max_header_bytes));
    parser.body_limit(options.max_body_bytes);
    // An idle keep-alive connection may wait longer than a client that has started a request.
    stream.expires_after(first || buffer.size() > 0 ? options.header_timeout : options.keep_alive_timeout);
    first = false;
    auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, kNoThrow);
    if (ec) {
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
          ec == net::error::connection_reset || ec == net::error::operation_aborted) {
        break;
      }
      if (ec == http::error::header_limit) {
        co_await reject(stream, error_response(431, "request headers are too large"));
      } else if (ec == http::error::body_limit) {  // a Content-Length over the limit fails the header read
        co_await reject(stream, body_too_large(options.max_body_bytes));
      } else {
        co_await reject(stream, error_response(400, "malformed HTTP request: " + ec.message()));
      }
      co_await lingering_close(stream);
      co_return;
    }

    auto& msg = parser.get();
    // curl and others wait for "100 Continue" before sending bodies over 1 KiB.
    if (beast::iequals(msg[http::field::expect], "100-continue")) {
      http::response<http::empty_body> cont{http::status::continue_, 11};
      stream.expires_after(options.write_timeout);
      auto [wec, wn] = co_await http::async_write(stream, cont, kNoThrow);
      if (wec) break;
    }
    if (!parser.is_done()) {
      stream.expires_after(options.header_timeout);
      auto [bec, bn] = co_await http::async_read(stream, buffer, parser, kNoThrow);
      if (bec) {
        if (bec == http::error::body_limit) {
          co_await reject(stream, body_too_large(options.max_body_bytes));
          co_await lingering_close(stream);
        } else if (bec != beast::error::timeout && bec != net::error::eof &&
                   bec != http::error::partial_message && bec != net::error::connection_reset) {
          co_await reject(stream, error_response(400, "malformed HTTP request: " + bec.message()));
          co_await lingering_close(stream);
        }
        co_return;
      }
    }

    bool keep_alive = msg.keep_alive() && !stopping.load();
    HttpRequest request = to_request(parser.release(), remote);
    Reply reply;
    try {
      reply = handler(request);
    } catch (const ApiError& e) {
      reply.response = error_response(e);
    } catch (const std::exception& e) {
      spdlog::error("http: handler failed on {} {}: {}", request.method, request.path, e.what());
      reply.response = error_response(500, std::string("internal error: ") + e.what());
    }
    bool ok = reply.body ? co_await write_deferred(stream, std::move(reply.body), keep_alive)
                         : co_await write_response(stream, std::move(reply.response), keep_alive);
    if (!ok || !keep_alive) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.socket().close(ec);
}

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() { stop(); }

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
  net::co_spawn(impl_->ioc, impl_->accept_loop(), net::detached);
  for (int i = 0; i < std::max(1, o.threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

size_t HttpServer::active_responses() const { return impl_->active.load(); }

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
}

}  // namespace moeserve::server
