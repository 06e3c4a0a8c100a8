#include "backend/backend.h"

#include <algorithm>
#include <vector>

#include "common/error.h"

#ifdef MOESERVE_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moeserve {

void Backend::argmax(const float* x, int64_t rows, int64_t cols, int32_t* out_host) {
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    download(x + r * cols, row.data(), size_t(cols));
    out_host[r] = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  }
}

std::unique_ptr<Backend> make_backend(std::string_view device, const BackendOptions& options) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
#ifdef MOESERVE_HAS_CUDA
    return make_cuda_backend(options);
#else
    (void)options;
    fail("this moeserve was built without CUDA (configure with -DMOESERVE_CUDA=ON)");
#endif
  }
  fail("unknown device '{}' (expected cpu or cuda)", device);
}

bool cuda_available() {
#ifdef MOESERVE_HAS_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace moeserve
