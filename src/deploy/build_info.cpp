#include "deploy/build_info.h"

// src/deploy/CMakeLists.txt defines both from the cache variables that build the CUDA backend (the list
// comma-separated).
#ifndef MOESERVE_BUILD_CUDA
#error "MOESERVE_BUILD_CUDA must be defined by the build"
#endif
#ifndef MOESERVE_BUILD_CUDA_ARCHS
#error "MOESERVE_BUILD_CUDA_ARCHS must be defined by the build"
#endif

namespace moeserve::deploy {

BuildInfo this_build() {
  BuildInfo b;
  b.cuda = MOESERVE_BUILD_CUDA != 0;
  if (!b.cuda) return b;
  std::string list = MOESERVE_BUILD_CUDA_ARCHS;
  for (size_t start = 0; start <= list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (end > start) b.cuda_archs.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return b;
}

}  // namespace moeserve::deploy
