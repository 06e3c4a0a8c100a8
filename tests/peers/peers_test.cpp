// The shared peers themselves: a child process's output captured and logged, waited for by line and by exit,
// stopped cleanly even when a grandchild holds its output open; the HTTP client against a scripted loopback
// server (whole responses, chunks one at a time, a body that ends with the server's close, a truncated one);
// FakeBackend answering and recording what it was sent.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "child_process.h"
#include "fake_backend.h"
#include "http_client.h"
#include "loopback.h"
#include "run_process.h"

namespace moeserve::peers {
namespace {

using namespace std::chrono_literals;

constexpr auto kGuard = 60s;  // hang guards only

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ChildProcess, CapturesOutputWaitsForALineAndForTheExit) {
  const std::string log = ::testing::TempDir() + "peers-child.log";
  ChildProcess p({"sh", "-c", "echo starting; echo 'ready: port=42'; echo oops >&2; exit 3"},
                 {.env = {"PEERS_TEST=1"}, .log_path = log});
  auto line = p.wait_for_line("ready:", kGuard);
  ASSERT_TRUE(line);
  EXPECT_EQ(*line, "ready: port=42");
  EXPECT_EQ(p.wait_exit(kGuard), 3);
  EXPECT_EQ(p.output(), "starting\nready: port=42\noops\n");
  EXPECT_EQ(read_file(log), p.output());
  EXPECT_FALSE(p.running());
}

TEST(ChildProcess, RunsInItsDirectoryWithTheExtraEnvironment) {
  ChildProcess p({"sh", "-c", "pwd; echo $PEERS_TEST"}, {.cwd = "/", .env = {"PEERS_TEST=from-test"}});
  EXPECT_EQ(p.wait_exit(kGuard), 0);
  EXPECT_EQ(p.output(), "/\nfrom-test\n");
}

TEST(ChildProcess, AnExitWithoutTheLineIsNoWaitAndAMissingProgramThrows) {
  ChildProcess p({"sh", "-c", "echo partial"});
  EXPECT_FALSE(p.wait_for_line("never", kGuard));
  EXPECT_EQ(p.wait_exit(kGuard), 0);
  EXPECT_THROW(ChildProcess({"/nonexistent/program"}), std::runtime_error);
}

TEST(ChildProcess, StopSendsItsSignalAndAGrandchildHoldingTheOutputDoesNotHang) {
  // The shell traps SIGTERM and exits 7; its background sleep keeps the output pipe open after that.
  ChildProcess p({"sh", "-c", "trap 'exit 7' TERM; sleep 600 & echo up; wait"}, {.stop_signal = SIGTERM});
  ASSERT_TRUE(p.wait_for_line("up", kGuard));
  EXPECT_EQ(p.stop(), 7);
  EXPECT_FALSE(p.running());
  // The default stop is SIGKILL.
  ChildProcess q({"sleep", "600"});
  EXPECT_EQ(q.stop(), 128 + SIGKILL);
}

TEST(RunCommand, GivesTheExitCodeAndBothOutputs) {
  CommandResult r = run_command("echo out; echo err >&2; exit 4");
  EXPECT_EQ(r.status, 4);
  EXPECT_EQ(r.output, "out\nerr\n");
  EXPECT_EQ(run_command("kill -9 $$").status, 128 + SIGKILL);
}

TEST(RunProcess, PassesArgvEnvAndStdinAndKeepsTheOutputsApart) {
  RunResult r = run_process({"sh", "-c", "echo \"$1 $GREETING\"; cat; echo oops >&2; exit 3", "sh", "a b"},
                            {.env = {"GREETING=hello"}, .input = "from stdin\n"});
  EXPECT_EQ(r.status, 3);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "a b hello\nfrom stdin\n");
  EXPECT_EQ(r.err, "oops\n");
  // Input larger than a pipe holds, echoed back while it is written: neither side blocks the other.
  std::string big(1 << 20, 'x');
  EXPECT_EQ(run_process({"cat"}, {.input = big}).out, big);
  EXPECT_EQ(run_shell("pwd", {.cwd = "/"}).out, "/\n");
}

TEST(RunProcess, ACommandThatCannotStartSaysSo) {
  RunResult r = run_process({"/nonexistent/tool"});
  EXPECT_EQ(r.status, -1);
  EXPECT_NE(r.err.find("cannot start /nonexistent/tool"), std::string::npos) << r.err;
}

TEST(RunProcess, TheHangGuardKillsTheWholeProcessGroup) {
  // The sleep in the pipeline holds stdout open as well: only killing the group ends the read.
  RunResult r = run_shell("sleep 600 | cat", {.timeout = std::chrono::milliseconds(200)});
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.status, 128 + SIGKILL);
}

// A server that answers each connection with `reply` (after reading a request head) and closes.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = listen_loopback(port_);
    thread_ = std::thread([this] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        head.append(buf, size_t(n));
      }
      request_ = head;
      send_all(c, reply_.data(), reply_.size());
      ::close(c);
    });
  }
  ~ScriptedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return port_; }
  // The request head it read (once it has answered).
  std::string request() {
    if (thread_.joinable()) thread_.join();
    return request_;
  }

 private:
  std::string reply_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::string request_;
};

TEST(HttpClient, ReadsALengthBodyAndSendsAWellFormedRequest) {
  ScriptedServer server("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing:  spaced  \r\n\r\nhello");
  HttpResponse r = http_request(server.port(), "POST", "/v1/x", "{}", {{"Authorization", "Bearer k"}});
  EXPECT_EQ(r.version, "HTTP/1.1");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello");
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.header("x-thing"), "spaced");
  // The head, then the body (which the server may or may not have read with it).
  const std::string head =
      "POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\nContent-Type: "
      "application/json\r\n"
      "Content-Length: 2\r\n\r\n";
  const std::string request = server.request();
  EXPECT_EQ(request.substr(0, head.size()), head);
  EXPECT_TRUE(request.size() == head.size() || request.substr(head.size()) == "{}") << request;
}

TEST(HttpClient, ReadsChunksOneAtATime) {
  ScriptedServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n");
  HttpClient client(server.port());
  ASSERT_TRUE(client.send("GET", "/stream"));
  HttpResponse r;
  ASSERT_TRUE(client.read_head(r));
  EXPECT_TRUE(client.chunked());
  EXPECT_EQ(client.read_chunk(r), "first");
  EXPECT_EQ(client.read_chunk(r), "second");
  EXPECT_FALSE(client.read_chunk(r));
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.body, "firstsecond");
}

TEST(HttpClient, ReadUntilStopsAtTheTextOrAtTheEndOfTheBody) {
  ScriptedServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");
  HttpClient client(server.port());
  HttpResponse r;
  ASSERT_TRUE(client.send("GET", "/") && client.read_head(r));
  EXPECT_TRUE(client.read_until(r, "b"));
  EXPECT_EQ(r.body, "abc");  // no further than the piece that holds it
  EXPECT_FALSE(client.read_until(r, "never"));
  EXPECT_EQ(r.body, "abcdef");
  EXPECT_TRUE(r.complete);
}

TEST(HttpClient, ABodyEndsAtTheCloseAndATruncatedOneIsIncomplete) {
  {
    ScriptedServer server("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end");
    HttpResponse r = http_request(server.port(), "GET", "/");
    EXPECT_TRUE(r.complete);
    EXPECT_EQ(r.body, "until the end");
  }
  {
    ScriptedServer server("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
    HttpResponse r = http_request(server.port(), "GET", "/");
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.complete);
    EXPECT_EQ(r.body, "short");
  }
  {
    ScriptedServer server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
    HttpResponse r = http_request(server.port(), "GET", "/");
    EXPECT_FALSE(r.complete);
    EXPECT_EQ(r.body, "first");
  }
}

TEST(HttpClient, WaitClosedKeepsWhatCameFirstAndNobodyListeningIsNotConnected) {
  ScriptedServer server("raw bytes, then the close");
  HttpClient client(server.port());
  ASSERT_TRUE(client.send_raw("GET / HTTP/1.1\r\n\r\n"));
  std::string got;
  EXPECT_TRUE(client.wait_closed(int(std::chrono::milliseconds(kGuard).count()), &got));
  EXPECT_EQ(got, "raw bytes, then the close");
  EXPECT_FALSE(HttpClient(free_port()).connected());
  EXPECT_EQ(http_request(free_port(), "GET", "/").status, 0);
}

TEST(FakeBackend, HandsEachRequestToItsHandlerAndRecordsIt) {
  FakeBackend backend([](const HttpRequest& r, BackendConnection& c) {
    if (r.target == "/stream") {
      c.start_stream();
      c.chunk("one");
      c.chunk("two");
      c.end_stream();
    } else {
      c.respond(201, "{\"echo\":" + r.body + "}", "application/json", {{"X-Seen", r.header("x-test")}});
    }
  });
  HttpResponse whole = http_request(backend.port(), "POST", "/v1/x", "[1]", {{"X-Test", "yes"}});
  EXPECT_EQ(whole.status, 201);
  EXPECT_EQ(whole.body, "{\"echo\":[1]}");
  EXPECT_EQ(whole.header("x-seen"), "yes");
  HttpClient client(backend.port());
  ASSERT_TRUE(client.send("GET", "/stream"));
  HttpResponse streamed;
  ASSERT_TRUE(client.read_head(streamed));
  EXPECT_EQ(client.read_chunk(streamed), "one");
  EXPECT_EQ(client.read_chunk(streamed), "two");
  EXPECT_FALSE(client.read_chunk(streamed));
  EXPECT_TRUE(streamed.complete);
  ASSERT_TRUE(backend.wait_requests(2));
  const auto requests = backend.requests();
  EXPECT_EQ(requests[0].method + " " + requests[0].target + " " + requests[0].version, "POST /v1/x HTTP/1.1");
  EXPECT_EQ(requests[0].body, "[1]");
  EXPECT_EQ(requests[1].target, "/stream");
  EXPECT_EQ(backend.connections_accepted(), 2u);
}

// Whether 127.0.0.1:port can be bound right now.
bool can_bind(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return bound;
}

TEST(Loopback, AFreePortPairIsTwoFreePortsInARow) {
  const uint16_t base = free_port_pair();
  ASSERT_NE(base, 0);
  EXPECT_TRUE(can_bind(base));
  EXPECT_TRUE(can_bind(uint16_t(base + 1)));
}

}  // namespace
}  // namespace moeserve::peers
