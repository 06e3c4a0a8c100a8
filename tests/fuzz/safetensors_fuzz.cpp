// The safetensors header parser: any input parses, with every tensor's bytes inside the input, or fails with
// a moeserve::Error that names the file.
#include <cstdint>
#include <span>

#include "common/error.h"
#include "fuzz_target.h"
#include "model/safetensors.h"

namespace moeserve::fuzz {

Verdict fuzz_safetensors(std::string_view data) {
  constexpr const char* kName = "fuzz.safetensors";
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  SafetensorsHeader header;
  try {
    header = parse_safetensors(bytes, kName);
  } catch (const Error& e) {
    FUZZ_CHECK(std::string_view(e.what()).find(kName) != std::string_view::npos,
               "the error does not name the "
               "file: {}",
               e.what());
    return Verdict::kRefused;
  }
  for (const auto& t : header.tensors) {
    if (t.nbytes == 0) continue;
    // Compared as addresses, and touched: AddressSanitizer reports a view that escapes the input.
    FUZZ_CHECK(t.data >= bytes.data() + 8 && t.data + t.nbytes <= bytes.data() + bytes.size(),
               "tensor '{}' lies outside the input", t.name);
    volatile uint8_t sink = t.data[0] ^ t.data[t.nbytes - 1];
    (void)sink;
  }
  return Verdict::kAccepted;
}

}  // namespace moeserve::fuzz
