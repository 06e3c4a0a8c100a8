#pragma once
// Communicator: the collectives tensor parallelism needs (docs/tp.md), over an existing library: Open MPI
// for the CPU backend (so CI runs the same sharding logic), NCCL for the CUDA backend. One process per rank.
//
// Float collectives work on memory where the backend keeps activations (host memory for the CPU backend,
// device memory for CUDA); host collectives (broadcast, barrier) on host memory. Every rank must make the
// same calls in the same order. A rank that dies makes the others' calls throw or end the process; they
// never wait for it forever.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moeserve::dist {

// What crossed the ranks since the last reset (per rank; bytes are one rank's payload).
struct CommStats {
  uint64_t all_reduce_calls = 0, all_reduce_bytes = 0;
  uint64_t all_gather_calls = 0, all_gather_bytes = 0;
  double seconds = 0;  // host wall time inside float collectives (the CPU path blocks; NCCL only enqueues)
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi (2 ranks)", "nccl ...": for logs.
  virtual std::string describe() const = 0;

  // data[n] = Σ over ranks of data[n], in place.
  void all_reduce_sum(float* data, size_t n);
  // out[size()][n] = every rank's in[n], in rank order.
  void all_gather(const float* in, size_t n, float* out);
  // Rank 0's bytes to every rank (the step's batch description); other ranks' vectors are replaced.
  virtual void broadcast(std::vector<uint8_t>& bytes) = 0;
  virtual void barrier() = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  virtual void do_all_reduce_sum(float* data, size_t n) = 0;
  virtual void do_all_gather(const float* in, size_t n, float* out) = 0;

 private:
  CommStats stats_;
};

// How a process joins its tensor-parallel group (the serve/verify flags).
struct GroupOptions {
  int tp = 1;                    // ranks in the group
  int nnodes = 1;                // hosts the group spans
  int node_rank = 0;             // this host's index
  std::string dist_init_addr{};  // HOST:PORT where rank 0 listens for the others (NCCL without mpirun)
  std::string device = "cpu";    // backend: "cpu" (MPI) or "cuda" (NCCL)
  void* cuda_stream = nullptr;   // cudaStream_t the backend runs on (NCCL enqueues there)
};

// The group this process belongs to: a single rank when tp == 1; for tp > 1 on the CPU, MPI_COMM_WORLD
// (launched by mpirun, whose -np must equal tp); on CUDA, NCCL with the unique id sent over MPI (under
// mpirun) or over TCP from dist_init_addr (one process per node). Throws with what to change otherwise.
std::unique_ptr<Communicator> open_group(const GroupOptions& options);

// A group of one (no communication; what TP=1 uses).
std::unique_ptr<Communicator> make_single_communicator();

// Whether this build has MPI / NCCL, and whether this process was started by mpirun.
bool mpi_available();
bool nccl_available();
bool launched_by_mpirun();

}  // namespace moeserve::dist
