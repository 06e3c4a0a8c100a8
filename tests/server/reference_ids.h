#pragma once
// Token ids from a fixture model's Hugging Face reference (its reference.safetensors, int64 tensors such as
// "prompt0.input_ids" or "gen0.output_ids"), for the end-to-end suites that compare served tokens with them.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace moeserve::server {

inline std::vector<int32_t> reference_ids(const std::string& model_dir, const std::string& name) {
  auto set = TensorSet::open_file(model_dir + "/reference.safetensors");
  const TensorInfo* t = set.find(name);
  EXPECT_NE(t, nullptr) << name << " in " << model_dir;
  std::vector<int32_t> ids;
  if (!t) return ids;
  auto* p = reinterpret_cast<const int64_t*>(t->data);
  for (int64_t i = 0; i < t->numel(); ++i) ids.push_back(static_cast<int32_t>(p[i]));
  return ids;
}

}  // namespace moeserve::server
