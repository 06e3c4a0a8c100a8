// The HTTP/1.1 layer on a loopback port, driven by raw sockets: keep-alive, limits, malformed input,
// streaming from another thread, disconnect cancellation, slow readers and shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "http_client.h"
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
  void SetUp() override {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    o.max_body_bytes = 1024;
    o.max_header_bytes = 4096;
    o.header_timeout = std::chrono::seconds(5);
    o.write_timeout = std::chrono::seconds(5);
    server_ = std::make_unique<HttpServer>(o, [this](HttpRequest& req) { return handle(req); });
    server_->start();
  }
  void TearDown() override {
    // Stop first: a request still in flight could otherwise start a producer after the joins.
    server_->stop();
    std::lock_guard lock(mutex_);
    for (auto& t : producers_) t.join();
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
    if (req.path == "/hello") {
      r.response.body = "hi";
      r.response.content_type = "text/plain";
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

}  // namespace
}  // namespace moeserve::server
