#include "dist/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "common/error.h"
#include "dist/backends.h"

namespace moeserve::dist {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single rank"; }
  void broadcast(std::vector<uint8_t>&) override {}
  void barrier() override {}

 protected:
  void do_all_reduce_sum(float*, size_t) override {}
  void do_all_gather(const float* in, size_t n, float* out) override {
    if (in != out) std::copy(in, in + n, out);
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void Communicator::all_reduce_sum(float* data, size_t n) {
  auto t0 = std::chrono::steady_clock::now();
  do_all_reduce_sum(data, n);
  stats_.seconds += seconds_since(t0);
  stats_.all_reduce_calls++;
  stats_.all_reduce_bytes += n * sizeof(float);
}

void Communicator::all_gather(const float* in, size_t n, float* out) {
  auto t0 = std::chrono::steady_clock::now();
  do_all_gather(in, n, out);
  stats_.seconds += seconds_since(t0);
  stats_.all_gather_calls++;
  stats_.all_gather_bytes += n * sizeof(float);
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

bool launched_by_mpirun() {
  // Open MPI's launcher sets these in every rank's environment (MPICH's hydra sets PMI_SIZE).
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

bool mpi_available() {
#ifdef MOESERVE_HAS_MPI
  return true;
#else
  return false;
#endif
}

bool nccl_available() {
#ifdef MOESERVE_HAS_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> open_group(const GroupOptions& o) {
  check(o.tp >= 1, "--tp must be at least 1 (got {})", o.tp);
  check(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes,
        "--node-rank must be in [0, --nnodes) (got {} of {})", o.node_rank, o.nnodes);
  check(o.tp % o.nnodes == 0, "--tp {} must be a multiple of --nnodes {}", o.tp, o.nnodes);
  if (o.tp == 1) return make_single_communicator();

  if (o.device == "cuda") {
#ifndef MOESERVE_HAS_NCCL
    fail("--tp {} on cuda needs NCCL: this moeserve was built without CUDA (-DMOESERVE_CUDA=ON)", o.tp);
#else
    if (launched_by_mpirun()) return make_nccl_communicator_over_mpi(o);
    check(o.tp == o.nnodes,
          "--tp {} over {} node(s) without mpirun: start one process per GPU with mpirun, or one per node "
          "(--nnodes {}) with --dist-init-addr",
          o.tp, o.nnodes, o.tp);
    check(!o.dist_init_addr.empty(), "--tp {} over {} nodes needs --dist-init-addr HOST:PORT (rank 0's host)",
          o.tp, o.nnodes);
    return make_nccl_communicator_over_tcp(o, o.node_rank);
#endif
  }

#ifndef MOESERVE_HAS_MPI
  fail(
      "--tp {} on the CPU needs MPI: this moeserve was built without it (install libopenmpi-dev, "
      "reconfigure)",
      o.tp);
#else
  check(launched_by_mpirun(),
        "--tp {} on the CPU runs one process per rank: start it as mpirun -np {} moeserve ...", o.tp, o.tp);
  return make_mpi_communicator(o.tp);
#endif
}

}  // namespace moeserve::dist
