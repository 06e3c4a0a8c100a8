#include "dist/tcp_group.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "common/error.h"
#include "loopback.h"

namespace moeserve::dist {
namespace {

using peers::free_port;

TEST(TcpGroup, BroadcastAndBarrierReachEveryRank) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  auto follower = [&](int rank) {
    TcpGroup g(addr, rank, 3, 20);
    std::vector<uint8_t> bytes;
    g.broadcast(bytes);
    g.barrier();
    std::vector<uint8_t> empty{9, 9};
    g.broadcast(empty);
    EXPECT_TRUE(empty.empty());
    return bytes;
  };
  auto r1 = std::async(std::launch::async, follower, 1);
  auto r2 = std::async(std::launch::async, follower, 2);
  TcpGroup root(addr, 0, 3, 20);
  std::vector<uint8_t> payload(100000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7);
  root.broadcast(payload);
  root.barrier();
  std::vector<uint8_t> none;
  root.broadcast(none);
  EXPECT_EQ(r1.get(), payload);
  EXPECT_EQ(r2.get(), payload);
}

TEST(TcpGroup, DeadRankMakesTheOthersThrow) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  auto peer = std::async(std::launch::async, [&] { TcpGroup g(addr, 1, 2, 20); });  // joins, then exits
  TcpGroup root(addr, 0, 2, 20);
  peer.get();
  try {
    root.barrier();
    FAIL() << "barrier with a dead rank returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 closed the connection"), std::string::npos) << e.what();
  }
}

TEST(TcpGroup, FollowerGivesUpWhenRankZeroNeverComes) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  EXPECT_THROW(TcpGroup(addr, 1, 2, 0.5), Error);
}

TEST(TcpGroup, AddressMustHaveAPort) {
  EXPECT_EQ(split_host_port("node0:29500"), (std::pair<std::string, int>{"node0", 29500}));
  EXPECT_EQ(split_host_port("[::1]:7"), (std::pair<std::string, int>{"::1", 7}));
  EXPECT_THROW(split_host_port("node0"), Error);
  EXPECT_THROW(split_host_port("node0:x"), Error);
  EXPECT_THROW(split_host_port("node0:70000"), Error);
}

}  // namespace
}  // namespace moeserve::dist
