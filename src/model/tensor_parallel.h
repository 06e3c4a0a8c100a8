#pragma once
// Tensor-parallel sharding of loaded weights (docs/tp.md). Row-split matrices (column-parallel layers, the
// vocabulary) stay zero-copy views of the mapped checkpoint, so a rank never touches the other ranks'
// pages; column-split ones (the row-parallel o_proj, out_proj, down_proj) and the GDN q/k/v row groups are
// copied, slice by slice. FP8 blocks are kept when the cut falls on a block edge, else that slice is
// widened to float32 (the values the backends compute with, so results do not change).

#include "model/weights.h"

namespace moeserve {

// Rank `rank` of `size`'s part of `full`; its storage keeps `full`'s storage alive (the mapped files), not
// `full` itself. size == 1 returns a copy of the views.
ModelWeights shard_weights(const ModelWeights& full, int rank, int size);

// Slices used by shard_weights (exposed for tests): rows [r0, r0 + n) and columns [c0, c0 + n) of w.
// Copies go into `storage`.
Matrix slice_rows(const Matrix& w, int64_t r0, int64_t n, std::vector<std::shared_ptr<void>>& storage);
Matrix slice_cols(const Matrix& w, int64_t c0, int64_t n, std::vector<std::shared_ptr<void>>& storage);

}  // namespace moeserve
