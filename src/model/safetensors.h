#pragma once
// Safetensors files: reading (memory-mapped; one file, or shards listed in model.safetensors.index.json) and
// writing. The format: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, name: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...}
// then the data section; offsets count from the start of the data section.
// Malformed input of any kind is a moeserve::Error naming the file and the tensor, never a crash
// (the parser is fuzzed: tests/fuzz/).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"

namespace moeserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // where it came from, for messages

  int64_t numel() const;
  std::string describe() const;  // "BF16 [64, 32]"
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by name; data points into the parsed bytes
  std::map<std::string, std::string> metadata;
};

// Parses and validates a whole safetensors file image: header length within the file, valid JSON of the
// right shape, known dtypes, no duplicate names, offsets inside the data section, matching shape × dtype
// size, and no two tensors sharing bytes. `label` (the path) prefixes every error message.
SafetensorsHeader parse_safetensors(std::span<const uint8_t> bytes, const std::string& label);

// A set of named tensors whose bytes live in memory it keeps alive (mapped files or owned buffers).
class TensorSet {
 public:
  // One .safetensors file.
  static TensorSet open_file(const std::string& path);
  // A checkpoint directory: model.safetensors.index.json (sharded) if present, else model.safetensors.
  static TensorSet open_dir(const std::string& dir);

  // Throws if the name is already present (naming both files).
  void add(TensorInfo tensor);
  void keep_alive(std::shared_ptr<void> owner) { owners_.push_back(std::move(owner)); }

  const TensorInfo* find(std::string_view name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t total_bytes() const;

 private:
  void add_file(const std::string& path, const std::string& label);

  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::shared_ptr<void>> owners_;
};

// A tensor to write. fill(dst) writes exactly nbytes() bytes; it is called once, while writing, so a
// multi-gigabyte checkpoint never needs to be in memory at once.
struct TensorWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(uint8_t* dst)> fill;

  size_t nbytes() const;
  // A tensor whose bytes are copied from `bytes` (which must hold nbytes()).
  static TensorWrite copy_of(std::string name, DType dtype, std::vector<int64_t> shape,
                             std::span<const uint8_t> bytes);
};

// Writes one safetensors file. Tensors are laid out largest element size first so every tensor is aligned
// to its element size, with no gaps (strict readers reject gaps).
void write_safetensors(const std::string& path, std::span<const TensorWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes model.safetensors into dir, or, when the tensors exceed max_shard_bytes, shards named
// model-00001-of-0000N.safetensors plus model.safetensors.index.json (as Hugging Face save_pretrained does).
void write_safetensors_dir(const std::string& dir, std::span<const TensorWrite> tensors,
                           size_t max_shard_bytes);

}  // namespace moeserve
