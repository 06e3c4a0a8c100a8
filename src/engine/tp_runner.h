#pragma once
// Tensor-parallel serving (docs/tp.md): rank 0's engine schedules and samples; its runner sends each step's
// batch (tokens, positions, page tables, state slots) to the other ranks, which run the same forward on
// their shards of the weights and their own caches, laid out identically. Engines of a TP group run with
// the prefix cache off: its GDN state copies happen outside forward and would reach rank 0's caches only.

#include <memory>

#include "engine/model_runner.h"

namespace moeserve {

namespace dist {
class Communicator;
}

// Rank 0's runner over `shard` (cut for comm's rank 0); destroying it tells the followers to stop.
std::unique_ptr<ModelRunner> make_tp_leader_runner(const ModelWeights& shard, Backend& backend,
                                                   dist::Communicator& comm);

// A follower rank's loop: runs the steps rank 0 sends until rank 0's runner goes away; returns how many it
// ran. Throws (and so ends the process) when the group breaks.
int64_t run_tp_follower(const ModelWeights& shard, Backend& backend, dist::Communicator& comm);

}  // namespace moeserve
