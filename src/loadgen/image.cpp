#include "loadgen/image.h"

// clang-format off: jpeglib.h needs <cstdio> first.
#include <jpeglib.h>

#include <cstdio>
// clang-format on
#include <png.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace moeserve::loadgen {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double unit(uint64_t& state) {
  return double(splitmix(state) >> 11) * 0x1.0p-53;
}

// Per channel, a wave along x plus one along y: [height][width][3]. Cheap to draw (two tables), and
// different for every seed.
std::vector<uint8_t> draw(int width, int height, uint64_t seed) {
  uint64_t state = seed;
  std::vector<float> along_x(size_t(width) * 3), along_y(size_t(height) * 3);
  for (int c = 0; c < 3; ++c) {
    const double fx = 0.005 + 0.05 * unit(state), px = 6.2832 * unit(state);
    const double fy = 0.005 + 0.05 * unit(state), py = 6.2832 * unit(state);
    for (int x = 0; x < width; ++x) along_x[size_t(x) * 3 + c] = float(63 * std::sin(fx * x + px));
    for (int y = 0; y < height; ++y) along_y[size_t(y) * 3 + c] = float(63 * std::sin(fy * y + py));
  }
  std::vector<uint8_t> rgb(size_t(width) * size_t(height) * 3);
  for (int y = 0; y < height; ++y) {
    uint8_t* row = &rgb[size_t(y) * size_t(width) * 3];
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        row[x * 3 + c] =
            uint8_t(std::lround(127.5f + along_x[size_t(x) * 3 + c] + along_y[size_t(y) * 3 + c]));
  }
  return rgb;
}

std::string encode_png(const std::vector<uint8_t>& rgb, int width, int height) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = uint32_t(width);
  image.height = uint32_t(height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  check(png_image_write_to_memory(&image, nullptr, &size, 0, rgb.data(), 0, nullptr) != 0,
        "libpng cannot encode a {}x{} picture: {}", width, height, image.message);
  std::string out(size, '\0');
  check(png_image_write_to_memory(&image, out.data(), &size, 0, rgb.data(), 0, nullptr) != 0,
        "libpng cannot encode a {}x{} picture: {}", width, height, image.message);
  out.resize(size);
  return out;
}

// libjpeg's default error handler exits the process; nothing here can fail on a valid picture, but a
// failure must still be an exception.
[[noreturn]] void jpeg_throw(j_common_ptr cinfo) {
  char message[JMSG_LENGTH_MAX];
  cinfo->err->format_message(cinfo, message);
  fail("libjpeg cannot encode the picture: {}", message);
}

std::string encode_jpeg(const std::vector<uint8_t>& rgb, int width, int height) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  errors.error_exit = jpeg_throw;
  jpeg_create_compress(&cinfo);
  std::unique_ptr<jpeg_compress_struct, void (*)(jpeg_compress_struct*)> guard(&cinfo, jpeg_destroy_compress);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = JDIMENSION(width);
  cinfo.image_height = JDIMENSION(height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&rgb[size_t(cinfo.next_scanline) * size_t(width) * 3]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);  // jpeg_mem_dest's buffer is the caller's
  return out;
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
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

}  // namespace

ImageEncoding parse_image_encoding(std::string_view name) {
  if (name == "png") return ImageEncoding::png;
  if (name == "jpeg" || name == "jpg") return ImageEncoding::jpeg;
  fail("unknown image format '{}': use png or jpeg", name);
}

std::string_view image_encoding_name(ImageEncoding encoding) {
  return encoding == ImageEncoding::png ? "png" : "jpeg";
}

std::string synthetic_image(int width, int height, uint64_t seed, ImageEncoding encoding) {
  check(width > 0 && height > 0, "a picture needs pixels, not {}x{}", width, height);
  std::vector<uint8_t> rgb = draw(width, height, seed);
  return encoding == ImageEncoding::png ? encode_png(rgb, width, height) : encode_jpeg(rgb, width, height);
}

std::string image_data_url(std::string_view bytes, ImageEncoding encoding) {
  return std::string("data:image/") + std::string(image_encoding_name(encoding)) + ";base64," + base64(bytes);
}

void parse_image_size(std::string_view text, ImageShape& shape) {
  auto side = [&](std::string_view s) {
    int v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    check(ec == std::errc() && end == s.data() + s.size() && v >= 1 && v <= 16384,
          "--image-size {}: expected WIDTHxHEIGHT or one side, each 1 to 16384 pixels (e.g. 448 or 1024x768)",
          text);
    return v;
  };
  size_t x = text.find('x');
  shape.width = side(text.substr(0, x));
  shape.height = x == std::string_view::npos ? shape.width : side(text.substr(x + 1));
}

ImageSet::ImageSet(ImageShape shape, uint64_t seed, size_t prepared)
    : shape_(shape), seed_(seed), urls_(prepared) {
  if (prepared == 0) return;
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (size_t i; (i = next++) < urls_.size();) urls_[i] = url(i);
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      failure = std::current_exception();
      next = urls_.size();
    }
  };
  std::vector<std::thread> threads(std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8) - 1);
  for (auto& t : threads) t = std::thread(work);
  work();
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

std::string ImageSet::url(size_t index) const {
  if (index < urls_.size() && !urls_[index].empty()) return urls_[index];
  uint64_t state = seed_ ^ (0xA0761D6478BD642Full * (index + 1));
  return image_data_url(synthetic_image(shape_.width, shape_.height, splitmix(state), shape_.encoding),
                        shape_.encoding);
}

}  // namespace moeserve::loadgen
