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

}  // namespace moeserve::testing
