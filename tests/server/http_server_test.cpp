// The HTTP/1.1 layer on a loopback port, driven by raw sockets: keep-alive, limits, malformed input,
// streaming from another thread, disconnect cancellation, slow readers and shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "http_connection.h"
#include "server/http.h"

namespace moeserve::server {
namespace {

using testing_http::Connection;

// A body fed by a producer thread: push() appends output, finish() ends it.
class QueueBody : public AsyncBody {
 public:
  explicit QueueBody(bool chunked) : chunked_(chunked) {}
  void start(std::function<void()> wake) override {
    std::lock_guard lock(mutex_);
    wake_ = std::move(wake);
  }
  Step poll(Clock::time_point) override {
    std::lock_guard lock(mutex_);
    Step s;
    if (!head_sent_) {
      s.head = Head{200, chunked_ ? "text/event-stream" : "text/plain", {}, chunked_};
      head_sent_ = true;
    }
    for (auto& d : pending_) s.data += d;
    pending_.clear();
    s.done = finished_;
    return s;
  }
  void cancel() override { cancelled = true; }
  void push(std::string d) {
    std::function<void()> wake;
    {
      std::lock_guard lock(mutex_);
      pending_.push_back(std::move(d));
      wake = wake_;
    }
    if (wake) wake();
  }
  void finish() {
    std::function<void()> wake;
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
      wake = wake_;
    }
    if (wake) wake();
  }
  std::atomic<bool> cancelled{false};

 private:
  bool chunked_;
  std::mutex mutex_;
  std::function<void()> wake_;
  std::deque<std::string> pending_;
  bool finished_ = false;
  bool head_sent_ = false;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override { start(base_options()); }
  void TearDown() override {
    open_gate();  // a handler still waiting at /block would hold up stop()
    // Stop first: a request still in flight could otherwise start a producer after the joins.
    server_->stop();
    std::lock_guard lock(mutex_);
    for (auto& t : producers_) t.join();
  }

  static HttpServerOptions base_options() {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    o.max_body_bytes = 1024;
    o.max_header_bytes = 4096;
    o.header_timeout = std::chrono::seconds(5);
    o.write_timeout = std::chrono::seconds(5);
    return o;
  }
  // (Re)starts the server with these options.
  void start(HttpServerOptions o) {
    if (server_) server_->stop();
    server_ = std::make_unique<HttpServer>(o, [this](HttpRequest& req) { return handle(req); });
    server_->start();
  }

  // /block handlers wait here until the test opens the gate.
  void open_gate() {
    {
      std::lock_guard lock(gate_mutex_);
      gate_open_ = true;
    }
    gate_cv_.notify_all();
  }
  // Waits (up to 10 s, a hang guard) until n /block handlers have started.
  bool wait_blocked(int n) {
    std::unique_lock lock(gate_mutex_);
    return gate_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return blocked_ >= n; });
  }
  // Polls a condition the server reaches on its own threads (up to 10 s, a hang guard).
  template <typename Pred>
  static bool eventually(Pred pred) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  // The body of the last /flood or /wait request, once its handler has run (null after 5 s).
  std::shared_ptr<QueueBody> wait_for_body() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mutex_);
        if (last_body_) return last_body_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return nullptr;
  }

  Reply handle(HttpRequest& req) {
    Reply r;
    ++handled_;
    if (req.path == "/hello") {
      r.response.body = "hi";
      r.response.content_type = "text/plain";
    } else if (req.path == "/block") {
      std::unique_lock lock(gate_mutex_);
      ++blocked_;
      gate_cv_.notify_all();
      gate_cv_.wait(lock, [&] { return gate_open_; });
      r.response.body = "unblocked";
    } else if (req.path == "/echo") {
      r.response.body = req.method + " " + req.query + " " + std::string(req.header("x-test")) + " " + req.body;
    } else if (req.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (req.path == "/stream" || req.path == "/whole") {
      int n = req.query.empty() ? 5 : std::stoi(req.query);
      auto body = std::make_shared<QueueBody>(req.path == "/stream");
      std::lock_guard lock(mutex_);
      producers_.emplace_back([body, n] {
        for (int i = 0; i < n; ++i) {
          body->push("data: " + std::to_string(i) + "\n\n");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        body->finish();
      });
      r.body = body;
    } else if (req.path == "/flood") {
      // 64 MiB of output produced as fast as possible: far more than socket buffers hold.
      auto body = std::make_shared<QueueBody>(true);
      std::lock_guard lock(mutex_);
      producers_.emplace_back([body] {
        std::string block(1 << 20, 'x');
        for (int i = 0; i < 64 && !body->cancelled; ++i) body->push(block);
        body->finish();
      });
      last_body_ = body;
      r.body = body;
    } else if (req.path == "/wait") {
      auto body = std::make_shared<QueueBody>(true);
      std::lock_guard lock(mutex_);
      last_body_ = body;
      r.body = body;
    } else {
      r.response.status = 404;
      r.response.body = "{}";
    }
    return r;
  }

  std::unique_ptr<HttpServer> server_;
  std::mutex mutex_;  // handlers run on the server's threads
  std::vector<std::thread> producers_;
  std::shared_ptr<QueueBody> last_body_;
  std::atomic<int> handled_{0};  // handler calls
  std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  bool gate_open_ = false;
  int blocked_ = 0;
};

TEST_F(HttpServerTest, KeepAliveServesManyRequestsOnOneConnection) {
  Connection c(server_->port());
  for (int i = 0; i < 50; ++i) {
    auto r = c.roundtrip("POST", "/echo?i=" + std::to_string(i), "body", {"X-Test: yes"});
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "POST i=" + std::to_string(i) + " yes body");
    EXPECT_EQ(r.headers["server"], "moeserve");
  }
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Connection c(server_->port());
  ASSERT_TRUE(c.send(Connection::request("GET", "/hello") + Connection::request("POST", "/echo", "x") +
                     Connection::request("GET", "/stream?2")));
  EXPECT_EQ(c.read_response().body, "hi");
  EXPECT_EQ(c.read_response().body, "POST   x");
  EXPECT_EQ(c.read_response().body, "data: 0\n\ndata: 1\n\n");
}

TEST_F(HttpServerTest, OversizedBodyGets413AndTheServerKeepsServing) {
  {
    Connection c(server_->port());
    // Announce a body over the limit and send only part of it: the answer must not wait for the rest.
    ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" + std::string(2000, 'a')));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 413);
    EXPECT_NE(r.body.find("\"error\""), std::string::npos);
    EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(5)));
  }
  {
    Connection c(server_->port());
    std::string chunk(800, 'b');
    std::string chunked = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 3; ++i) chunked += "320\r\n" + chunk + "\r\n";
    ASSERT_TRUE(c.send(chunked + "0\r\n\r\n"));
    EXPECT_EQ(c.read_response().status, 413);
  }
  Connection c(server_->port());
  EXPECT_EQ(c.roundtrip("GET", "/hello").status, 200);
}

TEST_F(HttpServerTest, ExpectContinueGetsContinueOr413) {
  Connection c(server_->port());
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"));
  ASSERT_TRUE(c.send("abc"));
  auto r = c.read_response();  // the client skips the 100 Continue interim response
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST   abc");
  Connection big(server_->port());
  ASSERT_TRUE(big.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"));
  EXPECT_EQ(big.read_response().status, 413);
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndNeverWedgeTheServer) {
  for (std::string garbage : {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/9.9\r\n\r\n"),
                              std::string("POST /echo HTTP/1.1\r\nContent-Length: -4\r\n\r\n"),
                              std::string("POST /echo HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab"),
                              std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)}) {
    Connection c(server_->port());
    ASSERT_TRUE(c.send(garbage));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 400) << garbage;
  }
  Connection c(server_->port());
  EXPECT_EQ(c.roundtrip("GET", "/hello").status, 200);
}

TEST_F(HttpServerTest, HugeHeadersGet431) {
  Connection c(server_->port());
  EXPECT_EQ(c.roundtrip("GET", "/hello", "", {"X-Big: " + std::string(8000, 'h')}).status, 431);
}

TEST_F(HttpServerTest, HandlerExceptionIs500AndConnectionStaysUsable) {
  Connection c(server_->port());
  auto r = c.roundtrip("GET", "/throw");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("boom"), std::string::npos);
  EXPECT_EQ(c.roundtrip("GET", "/hello").status, 200);
}

TEST_F(HttpServerTest, StreamsChunksFromAnotherThreadInOrder) {
  Connection c(server_->port());
  auto r = c.roundtrip("GET", "/stream?200");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  auto events = testing_http::sse_data(r.body);
  ASSERT_EQ(events.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(events[i], std::to_string(i));
  // Non-chunked deferred bodies are sent whole with a Content-Length.
  auto whole = c.roundtrip("GET", "/whole?3");
  EXPECT_EQ(whole.headers["content-length"], std::to_string(whole.body.size()));
  EXPECT_EQ(whole.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST_F(HttpServerTest, ClientDisconnectCancelsTheBodyWhileWaiting) {
  {
    Connection c(server_->port());
    ASSERT_TRUE(c.send(Connection::request("GET", "/wait")));
    ASSERT_TRUE(wait_for_body());
  }  // closes the socket with the response still pending
  auto body = wait_for_body();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!body->cancelled && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(body->cancelled);
  auto t0 = std::chrono::steady_clock::now();
  while (server_->active_responses() > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->active_responses(), 0u);
}

TEST_F(HttpServerTest, SlowReaderDoesNotHoldUpOtherClients) {
  Connection slow(server_->port());
  ASSERT_TRUE(slow.send(Connection::request("GET", "/flood")));  // never read
  ASSERT_TRUE(wait_for_body());  // the flood is being produced before the others connect
  for (int i = 0; i < 20; ++i) {
    Connection c(server_->port());
    EXPECT_EQ(c.roundtrip("GET", "/hello").status, 200);
  }
  slow.close();  // the stalled write fails, the body is cancelled
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server_->active_responses() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server_->active_responses(), 0u);
}

TEST_F(HttpServerTest, StopLetsResponsesInProgressFinishWithinGrace) {
  Connection c(server_->port());
  ASSERT_TRUE(c.send(Connection::request("GET", "/wait")));
  auto body = wait_for_body();
  ASSERT_TRUE(body);
  std::thread finisher([body] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    body->push("data: last\n\n");
    body->finish();
  });
  server_->stop(std::chrono::seconds(10));
  finisher.join();
  auto r = c.read_response(std::chrono::seconds(5));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "data: last\n\n");
  // New connections are refused once stopped.
  EXPECT_THROW(Connection(server_->port()), std::runtime_error);
}

// With nothing in progress stop() does not wait, and the listening socket must still be closed: the close it
// posts to the IO threads may lose the race with stopping them, and an open listener goes on completing
// connections in the kernel that nobody answers.
TEST_F(HttpServerTest, StopWithNothingInProgressRefusesNewConnections) {
  for (int round = 0; round < 20; ++round) {
    start(base_options());
    EXPECT_EQ(Connection(server_->port()).roundtrip("GET", "/hello").status, 200);
    server_->stop(std::chrono::milliseconds(0));
    EXPECT_THROW(Connection(server_->port()), std::runtime_error) << "round " << round;
  }
}

TEST_F(HttpServerTest, HeadCheckAnswersBeforeTheBodyIsRead) {
  auto o = base_options();
  o.on_head = [](const HttpRequest& head) -> std::optional<HttpResponse> {
    if (head.path != "/echo" || head.header("x-key") == "k") return std::nullopt;
    EXPECT_TRUE(head.body.empty());
    return HttpResponse{401, "application/json", {}, "{\"error\":\"key\"}"};
  };
  start(o);
  // A body announced and never sent: the answer cannot have waited for it, nor charged it to the budget.
  for (const char* length : {"1000", "100000"}) {  // the second is over max_body_bytes: still 401 first
    Connection c(server_->port());
    ASSERT_TRUE(
        c.send(std::string("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: ") + length + "\r\n\r\n"));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 401) << length;
    EXPECT_EQ(r.headers["connection"], "close");
    EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(10)));
  }
  EXPECT_EQ(handled_, 0);
  EXPECT_EQ(server_->buffered_body_bytes(), 0u);
  // Expect: 100-continue: the 401 comes without waiting for the body.
  {
    Connection c(server_->port());
    ASSERT_TRUE(
        c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"));
    EXPECT_EQ(c.read_response().status, 401);
  }
  // Without a body the connection goes on; with the key the request reaches the handler.
  Connection c(server_->port());
  EXPECT_EQ(c.roundtrip("GET", "/echo").status, 401);
  auto r = c.roundtrip("POST", "/echo", "abc", {"X-Key: k"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST   abc");
  EXPECT_EQ(handled_, 1);
}

TEST_F(HttpServerTest, BodyBudgetAnswers503BeforeReadingAndChargesChunksAsTheyArrive) {
  auto o = base_options();
  o.max_buffered_body_bytes = 1000;
  start(o);
  // A holds 800 bytes of the budget: its body is announced, only partly sent.
  Connection a(server_->port());
  ASSERT_TRUE(a.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 800\r\n\r\n" + std::string(10, 'a')));
  ASSERT_TRUE(eventually([&] { return server_->buffered_body_bytes() == 800; }));
  {
    Connection b(server_->port());  // 300 more would pass 1000: refused before its body is read
    ASSERT_TRUE(b.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 300\r\n\r\n"));
    auto r = b.read_response();
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers["retry-after"], "1");
    EXPECT_TRUE(b.closed_by_peer(std::chrono::seconds(10)));
  }
  {
    Connection c(server_->port());  // chunked: the first chunk fits, the second does not
    ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" +
                       std::string(100, 'c') + "\r\nc8\r\n" + std::string(200, 'c') + "\r\n0\r\n\r\n"));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers["retry-after"], "1");
  }
  ASSERT_TRUE(eventually([&] { return server_->buffered_body_bytes() == 800; }));  // the refused give back
  EXPECT_EQ(Connection(server_->port()).roundtrip("POST", "/echo", std::string(150, 'd')).status, 200);
  ASSERT_TRUE(a.send(std::string(790, 'a')));
  auto r = a.read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST   " + std::string(800, 'a'));
  EXPECT_TRUE(eventually([&] { return server_->buffered_body_bytes() == 0; }));
}

TEST_F(HttpServerTest, ConnectionsOverTheLimitGet503AndTheSlotFreesOnClose) {
  auto o = base_options();
  o.max_connections = 2;
  start(o);
  Connection a(server_->port());
  Connection b(server_->port());
  ASSERT_EQ(a.roundtrip("GET", "/hello").status, 200);
  ASSERT_EQ(b.roundtrip("GET", "/hello").status, 200);
  {
    Connection c(server_->port());
    auto r = c.read_response();  // answered without sending anything
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers["retry-after"], "1");
    EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(10)));
  }
  a.close();
  ASSERT_TRUE(eventually([&] { return server_->open_connections() == 1; }));
  Connection d(server_->port());
  EXPECT_EQ(d.roundtrip("GET", "/hello").status, 200);
  EXPECT_EQ(b.roundtrip("GET", "/hello").status, 200);
}

TEST_F(HttpServerTest, HeavyHandlersRunOffTheIoThreadAndAFullPoolAnswers503) {
  auto o = base_options();
  o.threads = 1;
  o.worker_threads = 1;
  o.max_queued_work = 0;
  o.runs_inline = [](const HttpRequest& head) { return head.path == "/hello"; };
  start(o);
  Connection busy(server_->port());
  ASSERT_TRUE(busy.send(Connection::request("POST", "/block", "x")));
  ASSERT_TRUE(wait_blocked(1));
  // The only IO thread is free while the only worker waits: cheap requests are answered.
  Connection c(server_->port());
  EXPECT_EQ(c.roundtrip("GET", "/hello").body, "hi");
  auto r = c.roundtrip("POST", "/echo", "y");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_EQ(c.roundtrip("GET", "/hello").status, 200);  // the connection stays usable
  open_gate();
  EXPECT_EQ(busy.read_response().body, "unblocked");
  EXPECT_EQ(c.roundtrip("POST", "/echo", "y").body, "POST   y");
}

TEST_F(HttpServerTest, Http10StreamsWithoutChunkedAndClosesToEndTheBody) {
  Connection c(server_->port());
  ASSERT_TRUE(c.send("GET /stream?3 HTTP/1.0\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.count("transfer-encoding"), 0u);
  EXPECT_EQ(r.headers.count("content-length"), 0u);
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_EQ(r.body, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  // An HTTP/1.0 keep-alive is confirmed in the response, and the connection serves the next request.
  Connection k(server_->port());
  ASSERT_TRUE(k.send("GET /whole?1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  r = k.read_response();
  EXPECT_EQ(r.body, "data: 0\n\n");
  EXPECT_EQ(r.headers["connection"], "keep-alive");
  ASSERT_TRUE(k.send("GET /hello HTTP/1.0\r\n\r\n"));
  EXPECT_EQ(k.read_response().body, "hi");
}

TEST_F(HttpServerTest, Http11RequestWithoutOneHostIs400) {
  for (std::string raw : {std::string("GET /hello HTTP/1.1\r\n\r\n"),
                          std::string("GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")}) {
    Connection c(server_->port());
    ASSERT_TRUE(c.send(raw));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 400) << raw;
    EXPECT_NE(r.body.find("Host"), std::string::npos) << r.body;
  }
  Connection c(server_->port());
  ASSERT_TRUE(c.send("GET /hello HTTP/1.0\r\n\r\n"));  // HTTP/1.0 has no Host requirement
  EXPECT_EQ(c.read_response().status, 200);
  EXPECT_EQ(handled_, 1);
}

TEST_F(HttpServerTest, TransferEncodingOtherThanChunkedIsRefused) {
  struct Case {
    std::string headers;
    int status;
  };
  // Smuggled after each: a request that must never be served (Beast alone would take the body as one).
  const std::string smuggled = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n";
  for (const Case& k : std::vector<Case>{
           {"Transfer-Encoding: gzip, chunked\r\n", 501},
           {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501},
           {"Transfer-Encoding: chunked, gzip\r\n", 400},
           {"Transfer-Encoding: gzip\r\n", 400},
           {"Transfer-Encoding: chunked, chunked\r\n", 400},
       }) {
    Connection c(server_->port());
    ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\n" + k.headers + "\r\n" + smuggled));
    EXPECT_EQ(c.read_response().status, k.status) << k.headers;
    EXPECT_TRUE(c.closed_by_peer(std::chrono::seconds(10))) << k.headers;
  }
  Connection c(server_->port());  // HTTP/1.0 has no transfer codings: its framing cannot be trusted
  ASSERT_TRUE(c.send("POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  EXPECT_EQ(c.read_response().status, 400);
  EXPECT_EQ(handled_, 0);
  Connection ok(server_->port());  // coding names are case-insensitive
  ASSERT_TRUE(
      ok.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:  Chunked \r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  EXPECT_EQ(ok.read_response().body, "POST   abc");
}

TEST_F(HttpServerTest, MalformedChunkGets400) {
  for (std::string body : {std::string("zz\r\nabc\r\n0\r\n\r\n"), std::string("3\r\nabcXY0\r\n\r\n"),
                           std::string("3;\x01\r\nabc\r\n0\r\n\r\n")}) {
    Connection c(server_->port());
    ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + body));
    auto r = c.read_response();
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(r.body.find("malformed"), std::string::npos) << r.body;
  }
  Connection c(server_->port());
  ASSERT_TRUE(
      c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"));
  EXPECT_EQ(c.read_response().body, "POST   abc");
}

}  // namespace
}  // namespace moeserve::server
