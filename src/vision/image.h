#pragma once
// Images as the vision path sees them: 8-bit RGB, row-major, decoded from the bytes a request carried.
// PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp, the first frame of an animation) and GIF (giflib, the
// first frame) are told apart by their magic bytes, never by a declared MIME type. Transparency is composited
// over white, as transformers' convert_to_rgb does before Qwen's processor sees an image.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"

namespace moeserve {

// Input that is not a decodable image of a supported format, or is too large: the server answers 400.
class ImageError : public Error {
 public:
  using Error::Error;
};

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height][width][3]
};

struct DecodeLimits {
  // Refused before any pixel is decoded (a small file can declare a huge canvas). PIL's own
  // decompression-bomb threshold (Image.MAX_IMAGE_PIXELS), which vLLM and SGLang inherit.
  int64_t max_pixels = 89'478'485;
};

enum class ImageFormat { Png, Jpeg, WebP, Gif, Unknown };

ImageFormat sniff_image_format(std::span<const uint8_t> bytes);
const char* image_format_name(ImageFormat format);

// Throws ImageError naming what is wrong (unknown format, truncated or corrupt data, too many pixels).
Image decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});

// An image's format and size as its header declares them (for GIF and animated WebP, the canvas), read
// without decoding a pixel: what a request's budget is checked against before decode_image spends memory.
struct ImageInfo {
  ImageFormat format = ImageFormat::Unknown;
  int64_t width = 0;
  int64_t height = 0;
};
// Throws ImageError when the bytes are no image of a supported format or its header is unreadable.
ImageInfo probe_image(std::span<const uint8_t> bytes);

}  // namespace moeserve
