#pragma once
// The Hugging Face reference of tests/fixtures/models/tiny-moe-vl-image (reference.json says what each key
// holds), read as typed vectors for the vision tests.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace moeserve::testing {

inline const std::string kVisionFixture = "tests/fixtures/models/tiny-moe-vl-image";

class VisionReference {
 public:
  VisionReference() : set_(TensorSet::open_file(kVisionFixture + "/reference.safetensors")) {}

  const TensorInfo& info(const std::string& name) const {
    const TensorInfo* t = set_.find(name);
    if (t == nullptr) throw std::runtime_error("reference has no " + name);
    return *t;
  }
  template <typename T>
  std::vector<T> values(const std::string& name) const {
    const TensorInfo& t = info(name);
    std::vector<T> out(t.nbytes / sizeof(T));
    std::memcpy(out.data(), t.data, out.size() * sizeof(T));
    return out;
  }
  std::vector<float> floats(const std::string& name) const { return values<float>(name); }
  std::vector<int64_t> ints(const std::string& name) const { return values<int64_t>(name); }
  std::vector<uint8_t> bytes(const std::string& name) const { return values<uint8_t>(name); }

 private:
  TensorSet set_;
};

inline std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace moeserve::testing
