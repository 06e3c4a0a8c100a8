// libFuzzer target for the safetensors header parser: any input must parse or fail with moeserve::Error;
// every other exception, crash, or out-of-bounds access (AddressSanitizer) is a finding.
// Build and run: scripts/fuzz.sh (needs -DMOESERVE_FUZZ=ON and clang).
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto header = moeserve::parse_safetensors({data, size}, "fuzz.safetensors");
    // Touch both ends of every tensor: ASan reports any view that escapes the input.
    volatile uint8_t sink = 0;
    for (const auto& t : header.tensors) {
      if (t.nbytes == 0) continue;
      sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
    }
  } catch (const moeserve::Error&) {
  }
  return 0;
}
