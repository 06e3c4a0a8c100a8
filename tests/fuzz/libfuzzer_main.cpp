// The libFuzzer entry point of one target, chosen at compile time (tests/fuzz/CMakeLists.txt defines
// MOESERVE_FUZZ_TARGET as the function's name).
#include <cstddef>
#include <cstdint>

#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moeserve::fuzz::MOESERVE_FUZZ_TARGET({reinterpret_cast<const char*>(data), size});
  return 0;
}
