#pragma once
// Helpers shared by the model tests: temporary directories, raw safetensors access that does not go through
// the code under test, and rewriting a fixture checkpoint with edits.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace moeserve::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "moeserve-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
    if (path_.empty()) throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A safetensors image from a header text and a data section, exactly as given (no validation).
inline std::vector<uint8_t> safetensors_image(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(uint64_t(header.size()) >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Reads a tensor's bytes straight from the file with an independent header parse.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
inline RawTensor raw_tensor(const std::string& path, const std::string& name) {
  auto file = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[size_t(i)];
  auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + long(n));
  const auto& e = header.at(name);
  size_t begin = 8 + n + e["data_offsets"][0].get<size_t>(), end = 8 + n + e["data_offsets"][1].get<size_t>();
  return {e["dtype"],
          e["shape"].get<std::vector<int64_t>>(),
          {file.begin() + long(begin), file.begin() + long(end)}};
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

// Copies checkpoint `src` into `dst`, letting `edit` change the tensor list and `edit_config` the
// config.json.
inline void rewrite_checkpoint(const std::string& src, const std::string& dst,
                               const std::function<void(std::vector<TensorWrite>&)>& edit,
                               const std::function<void(nlohmann::json&)>& edit_config = {},
                               size_t max_shard_bytes = size_t(1) << 40) {
  TensorSet set = TensorSet::open_dir(src);
  std::vector<TensorWrite> tensors;
  for (const auto& t : set.tensors())
    tensors.push_back(TensorWrite::copy_of(t.name, t.dtype, t.shape, {t.data, t.nbytes}));
  if (edit) edit(tensors);
  write_safetensors_dir(dst, tensors, max_shard_bytes);
  auto config = read_json((fs::path(src) / "config.json").string());
  if (edit_config) edit_config(config);
  write_json((fs::path(dst) / "config.json").string(), config);
}

inline void erase_tensor(std::vector<TensorWrite>& tensors, const std::string& name) {
  std::erase_if(tensors, [&](const TensorWrite& t) { return t.name == name; });
}

// Runs fn, expects a moeserve::Error, and returns its message.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a moeserve::Error";
  return {};
}

inline std::vector<uint8_t> matrix_bytes(const Matrix& m) {
  auto* p = static_cast<const uint8_t*>(m.data);
  return {p, p + size_t(m.rows * m.cols) * dtype_size(m.dtype)};
}

// Every tensor view the model reads, for comparisons between two loads.
inline std::vector<const Matrix*> all_matrices(const ModelWeights& w) {
  std::vector<const Matrix*> out = {&w.embed, &w.lm_head};
  for (const auto& l : w.layers) {
    for (const Matrix* m :
         {&l.gdn.in_proj_qkv, &l.gdn.in_proj_z, &l.gdn.in_proj_b, &l.gdn.in_proj_a, &l.gdn.out_proj,
          &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj, &l.moe.router, &l.moe.shared_gate,
          &l.moe.shared.gate, &l.moe.shared.up, &l.moe.shared.down, &l.mlp.gate, &l.mlp.up, &l.mlp.down})
      out.push_back(m);
    for (const auto& e : l.moe.experts)
      for (const Matrix* m : {&e.gate, &e.up, &e.down}) out.push_back(m);
  }
  return out;
}

inline std::vector<float> dequantized(const Matrix& m) {
  std::vector<float> out(size_t(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.row_f32(r, out.data() + r * m.cols);
  return out;
}

inline void expect_same_weights(const ModelWeights& a, const ModelWeights& b) {
  auto ma = all_matrices(a), mb = all_matrices(b);
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    ASSERT_EQ(ma[i]->empty(), mb[i]->empty()) << i;
    if (ma[i]->empty()) continue;
    ASSERT_EQ(ma[i]->dtype, mb[i]->dtype) << i;
    ASSERT_EQ(ma[i]->rows, mb[i]->rows) << i;
    ASSERT_EQ(ma[i]->cols, mb[i]->cols) << i;
    ASSERT_EQ(matrix_bytes(*ma[i]), matrix_bytes(*mb[i])) << i;
    ASSERT_EQ(dequantized(*ma[i]), dequantized(*mb[i])) << i;
  }
  ASSERT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.final_norm, b.final_norm);
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].input_norm, b.layers[i].input_norm);
    EXPECT_EQ(a.layers[i].post_norm, b.layers[i].post_norm);
    EXPECT_EQ(a.layers[i].gdn.conv1d, b.layers[i].gdn.conv1d);
    EXPECT_EQ(a.layers[i].gdn.a_log, b.layers[i].gdn.a_log);
    EXPECT_EQ(a.layers[i].gdn.dt_bias, b.layers[i].gdn.dt_bias);
    EXPECT_EQ(a.layers[i].gdn.norm, b.layers[i].gdn.norm);
    EXPECT_EQ(a.layers[i].attn.q_norm, b.layers[i].attn.q_norm);
    EXPECT_EQ(a.layers[i].attn.k_norm, b.layers[i].attn.k_norm);
  }
}

}  // namespace moeserve::testing
