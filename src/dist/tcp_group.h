#pragma once
// TcpGroup: host-side rendezvous and control messages of a group started without mpirun (one process per
// node, rank 0 at --dist-init-addr). It carries the NCCL unique id and each step's batch description; the
// float collectives go over NCCL. A closed connection (a rank died) throws on the next call, never hangs.

#include <cstdint>
#include <string>
#include <vector>

namespace moeserve::dist {

class TcpGroup {
 public:
  // Rank 0 listens on HOST:PORT's port and waits up to timeout_s for the others; the others connect to
  // HOST:PORT, retrying until timeout_s (rank 0 may start later).
  TcpGroup(const std::string& host_port, int rank, int size, double timeout_s = 300);
  ~TcpGroup();
  TcpGroup(const TcpGroup&) = delete;
  TcpGroup& operator=(const TcpGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank 0's bytes to everyone.
  void broadcast(std::vector<uint8_t>& bytes);
  void barrier();

 private:
  void send_all(int fd, const void* data, size_t n, int peer);
  void recv_all(int fd, void* data, size_t n, int peer);

  int rank_, size_;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fds of ranks 1..size-1 (index rank-1); others: one fd to rank 0
};

// "HOST:PORT" (also "[v6]:PORT") split; throws on a missing or bad port.
std::pair<std::string, int> split_host_port(const std::string& host_port);

}  // namespace moeserve::dist
