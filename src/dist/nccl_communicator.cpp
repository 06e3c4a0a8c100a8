// NCCL for the float collectives (device memory, on the backend's stream, so they join its CUDA graphs);
// host collectives over MPI (mpirun, one process per GPU) or a TcpGroup (one process per node).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "common/error.h"
#include "dist/backends.h"
#include "dist/tcp_group.h"

namespace moeserve::dist {
namespace {

void nccl_ok(ncclResult_t rc, const char* what) {
  check(rc == ncclSuccess, "NCCL {} failed: {} ({})", what, ncclGetErrorString(rc),
        ncclGetLastError(nullptr));
}

class NcclCommunicator final : public Communicator {
 public:
  // `host` carries the unique id and later the host collectives; rank 0 makes the id.
  NcclCommunicator(std::unique_ptr<Communicator> host_mpi, std::unique_ptr<TcpGroup> host_tcp,
                   cudaStream_t stream)
      : mpi_(std::move(host_mpi)), tcp_(std::move(host_tcp)), stream_(stream) {
    rank_ = mpi_ ? mpi_->rank() : tcp_->rank();
    size_ = mpi_ ? mpi_->size() : tcp_->size();
    ncclUniqueId id{};
    if (rank_ == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<uint8_t> bytes(sizeof id);
    std::memcpy(bytes.data(), &id, sizeof id);
    broadcast(bytes);
    check(bytes.size() == sizeof id, "NCCL unique id of {} bytes received, expected {}", bytes.size(),
          sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);
    nccl_ok(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return fmt::format("nccl {}.{}.{} ({} ranks, host side over {})", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
                       size_, mpi_ ? "mpi" : "tcp");
  }
  void broadcast(std::vector<uint8_t>& bytes) override {
    if (mpi_) return mpi_->broadcast(bytes);
    tcp_->broadcast(bytes);
  }
  void barrier() override {
    if (mpi_) return mpi_->barrier();
    tcp_->barrier();
  }

 protected:
  void do_all_reduce_sum(float* data, size_t n) override {
    nccl_ok(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void do_all_gather(const float* in, size_t n, float* out) override {
    nccl_ok(ncclAllGather(in, out, n, ncclFloat32, comm_, stream_), "ncclAllGather");
  }

 private:
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<TcpGroup> tcp_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator_over_mpi(const GroupOptions& o) {
#ifdef MOESERVE_HAS_MPI
  return std::make_unique<NcclCommunicator>(make_mpi_communicator(o.tp), nullptr,
                                            static_cast<cudaStream_t>(o.cuda_stream));
#else
  fail(
      "--tp {} under mpirun needs a build with MPI (install libopenmpi-dev, reconfigure), or start one "
      "process per node with --dist-init-addr",
      o.tp);
#endif
}

std::unique_ptr<Communicator> make_nccl_communicator_over_tcp(const GroupOptions& o, int rank) {
  return std::make_unique<NcclCommunicator>(nullptr, std::make_unique<TcpGroup>(o.dist_init_addr, rank, o.tp),
                                            static_cast<cudaStream_t>(o.cuda_stream));
}

}  // namespace moeserve::dist
