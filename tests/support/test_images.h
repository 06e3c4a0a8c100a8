#pragma once
// The pictures the image suites send (tests/vision, tests/server): PNG bytes of given pixels through libpng's
// simplified writer, and data: URLs of encoded bytes. Link PkgConfig::PNG.

#include <png.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moeserve::testing_images {

// PNG bytes of width x height pixels of `channels` bytes each (1 gray, 3 RGB, 4 RGBA), rows top to bottom.
inline std::string encode_png(const uint8_t* pixels, int width, int height, int channels) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = uint32_t(width);
  image.height = uint32_t(height);
  image.format = channels == 1 ? PNG_FORMAT_GRAY : channels == 4 ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, nullptr))
    throw std::runtime_error(std::string("encode_png: ") + image.message);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels, 0, nullptr))
    throw std::runtime_error(std::string("encode_png: ") + image.message);
  out.resize(size);
  return out;
}

inline std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint8_t(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

inline std::string png_data_url(std::string_view png) {
  return "data:image/png;base64," + base64(png);
}

}  // namespace moeserve::testing_images
