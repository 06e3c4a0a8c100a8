#include "model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <random>

#include "common/error.h"

namespace moeserve {
namespace {

// A block-scaled FP8 matrix with random bytes (NaN codes avoided) and scales.
struct Fp8Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  Matrix m;
  Fp8Matrix(int64_t rows, int64_t cols, int block) {
    std::mt19937 rng(7);
    bytes.resize(size_t(rows * cols));
    for (auto& b : bytes) b = uint8_t(rng() % 0x7f) | uint8_t(rng() % 2 ? 0x80 : 0);
    m.dtype = DType::F8_E4M3;
    m.rows = rows;
    m.cols = cols;
    m.block_rows = m.block_cols = block;
    scales.resize(size_t((rows + block - 1) / block * m.scale_cols()));
    for (auto& s : scales) s = float(rng() % 100 + 1) / 64;
    m.data = bytes.data();
    m.scale_inv = scales.data();
  }
};

// Every element of `part` equals w[r0 + r][c0 + c] as the backends read it.
void expect_part(const Matrix& w, const Matrix& part, int64_t r0, int64_t c0) {
  std::vector<float> full(size_t(w.cols)), mine(size_t(part.cols));
  for (int64_t r = 0; r < part.rows; ++r) {
    w.row_f32(r0 + r, full.data());
    part.row_f32(r, mine.data());
    for (int64_t c = 0; c < part.cols; ++c) ASSERT_EQ(mine[size_t(c)], full[size_t(c0 + c)]) << r << "," << c;
  }
}

TEST(Sharding, Fp8SlicesOnBlockEdgesStayFp8) {
  Fp8Matrix f(256, 384, 128);
  std::vector<std::shared_ptr<void>> storage;
  Matrix rows = slice_rows(f.m, 128, 128, storage);
  EXPECT_EQ(rows.dtype, DType::F8_E4M3);
  EXPECT_TRUE(storage.empty());  // a view of the mapped bytes
  expect_part(f.m, rows, 128, 0);
  Matrix cols = slice_cols(f.m, 128, 256, storage);
  EXPECT_EQ(cols.dtype, DType::F8_E4M3);
  expect_part(f.m, cols, 0, 128);
}

TEST(Sharding, Fp8SlicesInsideBlocksAreWidened) {
  Fp8Matrix f(64, 256, 128);
  std::vector<std::shared_ptr<void>> storage;
  Matrix rows = slice_rows(f.m, 32, 32, storage);
  EXPECT_EQ(rows.dtype, DType::F32);
  expect_part(f.m, rows, 32, 0);
  Matrix cols = slice_cols(f.m, 64, 64, storage);
  EXPECT_EQ(cols.dtype, DType::F32);
  expect_part(f.m, cols, 0, 64);
}

TEST(Sharding, Bf16ColumnsAreCopied) {
  std::vector<uint16_t> data(6 * 8);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint16_t(0x3f80 + i);
  Matrix w{DType::BF16, 6, 8, data.data()};
  std::vector<std::shared_ptr<void>> storage;
  Matrix cols = slice_cols(w, 4, 4, storage);
  EXPECT_EQ(cols.dtype, DType::BF16);
  expect_part(w, cols, 0, 4);
  EXPECT_THROW(slice_cols(w, 6, 4, storage), Error);
}

ModelConfig tiny_moe() {
  ModelConfig c;
  c.is_moe = true;
  c.vocab_size = 510;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.layer_types = {LayerType::LinearAttention, LayerType::FullAttention};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.moe_intermediate_size = 32;
  c.shared_expert_intermediate_size = 32;
  return c;
}

TEST(Sharding, FewerKvHeadsThanRanksAreReplicated) {
  auto c = tiny_moe();
  for (int rank = 0; rank < 4; ++rank) {
    auto s = ShardLayout::plan(c, rank, 4);
    EXPECT_EQ(s.heads, 1);
    EXPECT_EQ(s.heads_begin, rank);
    EXPECT_EQ(s.kv_heads, 1);
    EXPECT_EQ(s.kv_heads_begin, rank / 2);  // q heads 0,1 read KV head 0; 2,3 read 1
    EXPECT_EQ(s.v_heads_begin, rank);
    EXPECT_EQ(s.k_heads_begin, rank / 2);
    EXPECT_EQ(s.moe_inter, 8);
    // 510 = 128 + 128 + 128 + 126: the last rank's slice is shorter.
    EXPECT_EQ(s.vocab_chunk, 128);
    EXPECT_EQ(s.vocab_rows, rank == 3 ? 126 : 128);
  }
  auto two = ShardLayout::plan(c, 1, 2);
  EXPECT_EQ(two.kv_heads, 1);
  EXPECT_EQ(two.kv_heads_begin, 1);
  auto local = two.local_config(c);
  EXPECT_EQ(local.num_heads, 2);
  EXPECT_EQ(local.num_kv_heads, 1);
  EXPECT_EQ(local.linear_num_key_heads, 1);
  EXPECT_EQ(local.linear_num_value_heads, 2);
  EXPECT_EQ(local.moe_intermediate_size, 16);
  EXPECT_EQ(local.vocab_size, 510);
}

TEST(Sharding, IndivisibleDimensionsAreNamed) {
  auto c = tiny_moe();
  try {
    ShardLayout::plan(c, 0, 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention heads"), std::string::npos) << e.what();
  }
  c.num_heads = 8;
  c.moe_intermediate_size = 36;
  EXPECT_THROW(ShardLayout::plan(c, 0, 8), Error);
}

}  // namespace
}  // namespace moeserve
