#pragma once
// What this moeserve binary was built with, for doctor: whether the CUDA backend is in it and the CUDA
// architectures its kernels were compiled for (CMake's MOESERVE_CUDA_ARCHITECTURES, e.g. "90a;121").

#include <string>
#include <vector>

namespace moeserve::deploy {

struct BuildInfo {
  bool cuda = false;
  std::vector<std::string> cuda_archs;  // as CMake took them: "90a", "121", "120-real", "native", ...
};

// This binary's build; CPU-only builds say {false, {}}.
BuildInfo this_build();

}  // namespace moeserve::deploy
