// MPI_COMM_WORLD as a Communicator (Open MPI from Debian). Float collectives on host memory: the CPU backend.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>

#include "common/error.h"
#include "dist/backends.h"

namespace moeserve::dist {
namespace {

void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("MPI {} failed: {}", what, std::string(text, size_t(len)));
}

// Initialises MPI once per process (a helper may open several communicators) and finalises it at exit.
void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  // Serialized: the engine thread makes the calls, not necessarily the main thread.
  int provided = 0;
  mpi_ok(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  check(provided >= MPI_THREAD_SERIALIZED, "this MPI library cannot be called from a thread other than main");
  // A failing collective throws instead of aborting, so the error names what failed; mpirun still takes
  // the job down when any rank exits non-zero.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    ensure_initialized();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return fmt::format("mpi ({} ranks)", size_); }

  void broadcast(std::vector<uint8_t>& bytes) override {
    uint64_t n = bytes.size();
    mpi_ok(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    bytes.resize(size_t(n));
    for (uint64_t off = 0; off < n;) {  // counts are int
      int chunk = int(std::min<uint64_t>(n - off, uint64_t(1) << 30));
      mpi_ok(MPI_Bcast(bytes.data() + off, chunk, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
      off += uint64_t(chunk);
    }
  }
  void barrier() override { mpi_ok(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 protected:
  void do_all_reduce_sum(float* data, size_t n) override {
    check(n <= size_t(INT32_MAX), "all-reduce of {} floats is beyond one MPI call", n);
    mpi_ok(MPI_Allreduce(MPI_IN_PLACE, data, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void do_all_gather(const float* in, size_t n, float* out) override {
    check(n <= size_t(INT32_MAX), "all-gather of {} floats is beyond one MPI call", n);
    mpi_ok(MPI_Allgather(in, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, MPI_COMM_WORLD), "MPI_Allgather");
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int expected_size) {
  auto comm = std::make_unique<MpiCommunicator>();
  check(comm->size() == expected_size, "--tp {} but mpirun started {} process(es): use mpirun -np {}",
        expected_size, comm->size(), expected_size);
  return comm;
}

}  // namespace moeserve::dist
