#pragma once
// The communicator implementations behind open_group (each compiled only when its library was found).

#include <memory>

#include "dist/communicator.h"

namespace moeserve::dist {

// MPI_COMM_WORLD (initialised here if needed, finalised at exit); throws unless its size is `expected_size`.
std::unique_ptr<Communicator> make_mpi_communicator(int expected_size);

// NCCL for the float collectives on options.cuda_stream, host collectives over MPI or over the TCP group
// that dist_init_addr sets up (rank 0 listens; its ncclUniqueId travels to the others that way).
std::unique_ptr<Communicator> make_nccl_communicator_over_mpi(const GroupOptions& options);
std::unique_ptr<Communicator> make_nccl_communicator_over_tcp(const GroupOptions& options, int rank);

}  // namespace moeserve::dist
