#include "model/tensor_parallel.h"

#include <cstring>
#include <utility>

#include "common/error.h"

namespace moeserve {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // (first, count)

// (first, count) of `total` heads a rank holds: an even split, or with fewer heads than ranks the one
// head that this rank's query (value) heads read, replicated over a run of ranks.
std::pair<int, int> split_heads(const char* what, int total, int rank, int size) {
  if (total % size == 0) return {rank * (total / size), total / size};
  check(size % total == 0,
        "tensor parallelism over {} ranks: {} {} neither split evenly nor replicate evenly", size, total,
        what);
  return {rank / (size / total), 1};
}

std::pair<int64_t, int64_t> split_even(const char* what, int64_t total, int rank, int size) {
  check(total % size == 0, "tensor parallelism over {} ranks: {} {} does not split evenly", size, what,
        total);
  return {rank * (total / size), total / size};
}

std::shared_ptr<std::vector<uint8_t>> new_bytes(size_t n, std::vector<std::shared_ptr<void>>& storage) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(n);
  storage.push_back(bytes);
  return bytes;
}

bool fp8(const Matrix& w) {
  return w.scale_inv != nullptr;
}

// Whether [first, first + count) of an axis of `total` starts and ends on block edges (or the axis's end).
bool on_blocks(int64_t first, int64_t count, int64_t total, int block) {
  return first % block == 0 && (count % block == 0 || first + count == total);
}

// Rows and columns of w widened to float32 (the values every backend computes with).
Matrix widen(const Matrix& w, const Ranges& rows, int64_t c0, int64_t cols,
             std::vector<std::shared_ptr<void>>& storage) {
  int64_t n = 0;
  for (auto [first, count] : rows) n += count;
  auto bytes = new_bytes(size_t(n * cols) * sizeof(float), storage);
  auto* out = reinterpret_cast<float*>(bytes->data());
  std::vector<float> row(size_t(w.cols));
  for (auto [first, count] : rows)
    for (int64_t r = first; r < first + count; ++r, out += cols) {
      w.row_f32(r, row.data());
      std::memcpy(out, row.data() + c0, size_t(cols) * sizeof(float));
    }
  Matrix m;
  m.dtype = DType::F32;
  m.rows = n;
  m.cols = cols;
  m.data = bytes->data();
  return m;
}

// Row ranges of w concatenated, in the stored dtype when FP8 blocks allow.
Matrix gather_rows(const Matrix& w, const Ranges& rows, std::vector<std::shared_ptr<void>>& storage) {
  if (rows.size() == 1) return slice_rows(w, rows[0].first, rows[0].second, storage);
  for (auto [first, count] : rows)
    if (fp8(w) && !on_blocks(first, count, w.rows, w.block_rows)) return widen(w, rows, 0, w.cols, storage);
  const size_t row_bytes = size_t(w.cols) * dtype_size(w.dtype);
  int64_t n = 0;
  for (auto [first, count] : rows) n += count;
  auto bytes = new_bytes(size_t(n) * row_bytes, storage);
  Matrix m = w;
  m.rows = n;
  m.data = bytes->data();
  uint8_t* out = bytes->data();
  for (auto [first, count] : rows) {
    std::memcpy(out, static_cast<const uint8_t*>(w.data) + size_t(first) * row_bytes,
                size_t(count) * row_bytes);
    out += size_t(count) * row_bytes;
  }
  if (fp8(w)) {
    const int64_t sc = w.scale_cols();
    auto scales = new_bytes(size_t((n + w.block_rows - 1) / w.block_rows * sc) * sizeof(float), storage);
    auto* s = reinterpret_cast<float*>(scales->data());
    for (auto [first, count] : rows) {
      const int64_t blocks = (count + w.block_rows - 1) / w.block_rows;
      std::memcpy(s, w.scale_inv + first / w.block_rows * sc, size_t(blocks * sc) * sizeof(float));
      s += blocks * sc;
    }
    m.scale_inv = reinterpret_cast<const float*>(scales->data());
  }
  return m;
}

std::vector<float> gather(const std::vector<float>& v, const Ranges& ranges, int64_t unit) {
  std::vector<float> out;
  for (auto [first, count] : ranges)
    out.insert(out.end(), v.begin() + first * unit, v.begin() + (first + count) * unit);
  return out;
}

void shard_swiglu(SwiGlu& out, const SwiGlu& in, int64_t first, int64_t count,
                  std::vector<std::shared_ptr<void>>& storage) {
  if (in.gate.empty()) return;
  // Column-parallel gate and up, row-parallel down: the partial outputs of the ranks sum to the output.
  out.gate = slice_rows(in.gate, first, count, storage);
  out.up = slice_rows(in.up, first, count, storage);
  out.down = slice_cols(in.down, first, count, storage);
}

}  // namespace

ShardLayout ShardLayout::plan(const ModelConfig& c, int rank, int size) {
  check(size >= 1 && rank >= 0 && rank < size, "tensor-parallel rank {} of {} is out of range", rank, size);
  ShardLayout s;
  s.rank = rank;
  s.size = size;
  check(c.vocab_size >= size, "tensor parallelism over {} ranks: vocab_size {} is smaller", size,
        c.vocab_size);
  s.vocab_chunk = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(c.vocab_size, rank * s.vocab_chunk);
  s.vocab_rows = std::min<int64_t>(c.vocab_size, s.vocab_begin + s.vocab_chunk) - s.vocab_begin;
  if (c.count_layers(LayerType::FullAttention) > 0) {
    check(c.num_heads % size == 0, "tensor parallelism over {} ranks: {} attention heads do not split evenly",
          size, c.num_heads);
    s.heads = c.num_heads / size;
    s.heads_begin = rank * s.heads;
    std::tie(s.kv_heads_begin, s.kv_heads) = split_heads("KV heads", c.num_kv_heads, rank, size);
  }
  if (c.count_layers(LayerType::LinearAttention) > 0) {
    check(c.linear_num_value_heads % size == 0,
          "tensor parallelism over {} ranks: {} GDN value heads do not split evenly", size,
          c.linear_num_value_heads);
    s.v_heads = c.linear_num_value_heads / size;
    s.v_heads_begin = rank * s.v_heads;
    std::tie(s.k_heads_begin, s.k_heads) = split_heads("GDN key heads", c.linear_num_key_heads, rank, size);
  }
  if (c.is_moe) {
    std::tie(s.moe_inter_begin, s.moe_inter) =
        split_even("moe_intermediate_size", c.moe_intermediate_size, rank, size);
    std::tie(s.shared_inter_begin, s.shared_inter) =
        split_even("shared_expert_intermediate_size", c.shared_expert_intermediate_size, rank, size);
  } else {
    std::tie(s.dense_inter_begin, s.dense_inter) =
        split_even("intermediate_size", c.intermediate_size, rank, size);
  }
  return s;
}

ModelConfig ShardLayout::local_config(const ModelConfig& full) const {
  if (size == 1) return full;
  ModelConfig c = full;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.linear_num_value_heads = v_heads;
  c.linear_num_key_heads = k_heads;
  c.moe_intermediate_size = moe_inter;
  c.shared_expert_intermediate_size = shared_inter;
  c.intermediate_size = dense_inter;
  return c;
}

Matrix slice_rows(const Matrix& w, int64_t r0, int64_t n, std::vector<std::shared_ptr<void>>& storage) {
  check(r0 >= 0 && n >= 0 && r0 + n <= w.rows, "row slice [{}, {}) of a {}-row matrix", r0, r0 + n, w.rows);
  if (fp8(w) && !on_blocks(r0, n, w.rows, w.block_rows)) return widen(w, {{r0, n}}, 0, w.cols, storage);
  Matrix m = w;
  m.rows = n;
  m.data = static_cast<const uint8_t*>(w.data) + size_t(r0 * w.cols) * dtype_size(w.dtype);
  if (fp8(w)) m.scale_inv = w.scale_inv + r0 / w.block_rows * w.scale_cols();
  return m;
}

Matrix slice_cols(const Matrix& w, int64_t c0, int64_t n, std::vector<std::shared_ptr<void>>& storage) {
  check(c0 >= 0 && n >= 0 && c0 + n <= w.cols, "column slice [{}, {}) of a {}-column matrix", c0, c0 + n,
        w.cols);
  if (fp8(w) && !on_blocks(c0, n, w.cols, w.block_cols)) return widen(w, {{0, w.rows}}, c0, n, storage);
  const size_t element = dtype_size(w.dtype);
  auto bytes = new_bytes(size_t(w.rows * n) * element, storage);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(bytes->data() + size_t(r * n) * element,
                static_cast<const uint8_t*>(w.data) + size_t(r * w.cols + c0) * element, size_t(n) * element);
  Matrix m = w;
  m.cols = n;
  m.data = bytes->data();
  if (fp8(w)) {
    const int64_t sc = w.scale_cols(), rows = (w.rows + w.block_rows - 1) / w.block_rows;
    const int64_t first = c0 / w.block_cols, count = (n + w.block_cols - 1) / w.block_cols;
    auto scales = new_bytes(size_t(rows * count) * sizeof(float), storage);
    auto* s = reinterpret_cast<float*>(scales->data());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(s + r * count, w.scale_inv + r * sc + first, size_t(count) * sizeof(float));
    m.scale_inv = s;
  }
  return m;
}

ModelWeights shard_weights(const ModelWeights& full, int rank, int size) {
  const ModelConfig& c = full.config;
  ModelWeights out;
  out.config = c;
  out.storage = full.storage;
  out.final_norm = full.final_norm;
  const ShardLayout s = ShardLayout::plan(c, rank, size);
  out.shard = s;
  auto& st = out.storage;
  // Vocab-parallel embedding and lm_head: the ranks' partial lookups sum (all-reduce), their logits gather.
  out.embed = slice_rows(full.embed, s.vocab_begin, s.vocab_rows, st);
  out.lm_head = c.tie_word_embeddings ? out.embed : slice_rows(full.lm_head, s.vocab_begin, s.vocab_rows, st);

  out.layers.resize(full.layers.size());
  for (size_t i = 0; i < full.layers.size(); ++i) {
    const LayerWeights& in = full.layers[i];
    LayerWeights& l = out.layers[i];
    l.type = in.type;
    l.input_norm = in.input_norm;
    l.post_norm = in.post_norm;
    if (in.type == LayerType::LinearAttention) {
      const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, key_dim = c.linear_key_dim();
      // Conv channels (and in_proj_qkv rows): this rank's q heads, k heads, then v heads.
      const Ranges channels{{s.k_heads_begin * dk, s.k_heads * dk},
                            {key_dim + s.k_heads_begin * dk, s.k_heads * dk},
                            {2 * key_dim + s.v_heads_begin * dv, s.v_heads * dv}};
      l.gdn.in_proj_qkv = gather_rows(in.gdn.in_proj_qkv, channels, st);
      l.gdn.in_proj_z = slice_rows(in.gdn.in_proj_z, s.v_heads_begin * dv, s.v_heads * dv, st);
      l.gdn.in_proj_b = slice_rows(in.gdn.in_proj_b, s.v_heads_begin, s.v_heads, st);
      l.gdn.in_proj_a = slice_rows(in.gdn.in_proj_a, s.v_heads_begin, s.v_heads, st);
      l.gdn.out_proj = slice_cols(in.gdn.out_proj, s.v_heads_begin * dv, s.v_heads * dv, st);
      l.gdn.conv1d = gather(in.gdn.conv1d, channels, c.linear_conv_kernel);
      l.gdn.dt_bias = gather(in.gdn.dt_bias, {{s.v_heads_begin, s.v_heads}}, 1);
      l.gdn.a_log = gather(in.gdn.a_log, {{s.v_heads_begin, s.v_heads}}, 1);
      l.gdn.norm = in.gdn.norm;
    } else {
      const int64_t hd = c.head_dim;
      l.attn.q_proj = slice_rows(in.attn.q_proj, s.heads_begin * 2 * hd, s.heads * 2 * hd, st);
      l.attn.k_proj = slice_rows(in.attn.k_proj, s.kv_heads_begin * hd, s.kv_heads * hd, st);
      l.attn.v_proj = slice_rows(in.attn.v_proj, s.kv_heads_begin * hd, s.kv_heads * hd, st);
      l.attn.o_proj = slice_cols(in.attn.o_proj, s.heads_begin * hd, s.heads * hd, st);
      l.attn.q_norm = in.attn.q_norm;
      l.attn.k_norm = in.attn.k_norm;
      l.attn.k_scale = in.attn.k_scale, l.attn.v_scale = in.attn.v_scale;
    }
    if (c.is_moe) {
      // Every rank routes (the router is small and its input is the same everywhere) and runs its slice
      // of each chosen expert.
      l.moe.router = in.moe.router;
      l.moe.experts.resize(in.moe.experts.size());
      for (size_t e = 0; e < in.moe.experts.size(); ++e)
        shard_swiglu(l.moe.experts[e], in.moe.experts[e], s.moe_inter_begin, s.moe_inter, st);
      shard_swiglu(l.moe.shared, in.moe.shared, s.shared_inter_begin, s.shared_inter, st);
      l.moe.shared_gate = in.moe.shared_gate;
    } else {
      shard_swiglu(l.mlp, in.mlp, s.dense_inter_begin, s.dense_inter, st);
    }
  }
  return out;
}

}  // namespace moeserve
