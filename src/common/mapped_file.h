#pragma once
// A read-only memory-mapped file. Checkpoints are mapped, never read into memory: weights stay in the
// page cache and a 70 GB checkpoint costs no copy.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace moeserve {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws moeserve::Error naming the path if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace moeserve
