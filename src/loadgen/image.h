#pragma once
// The pictures of the image scenario: deterministic synthetic images (smooth colour waves whose frequencies
// and phases come from a seed, so every request's picture is new to the server's prefix cache and to its
// tower), encoded as PNG (libpng) or JPEG (libjpeg-turbo) and sent as data: URLs in chat image_url parts.
// ImageSet encodes a run's pictures before the run starts: encoding a 1024² picture takes milliseconds the
// client's one IO thread would otherwise take from the streams it is timing.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::loadgen {

enum class ImageEncoding { png, jpeg };

ImageEncoding parse_image_encoding(std::string_view name);  // "png" or "jpeg"; throws moeserve::Error
std::string_view image_encoding_name(ImageEncoding encoding);

// The encoded bytes of a width x height RGB picture drawn from `seed`.
std::string synthetic_image(int width, int height, uint64_t seed, ImageEncoding encoding);

// "data:image/png;base64,..." (or image/jpeg) of those bytes.
std::string image_data_url(std::string_view bytes, ImageEncoding encoding);

struct ImageShape {
  int width = 448;
  int height = 448;
  ImageEncoding encoding = ImageEncoding::png;
};

// --image-size: "WxH" (e.g. 1024x768) or one number for a square, each side 1 to 16384; sets width and
// height. Throws moeserve::Error.
void parse_image_size(std::string_view text, ImageShape& shape);

// The data: URLs of a run's pictures, picture i drawn from (seed, i). Those below `prepared` are encoded up
// front (on several threads); later ones, when a run outlives its plan (--duration), when asked for.
class ImageSet {
 public:
  ImageSet(ImageShape shape, uint64_t seed, size_t prepared);
  std::string url(size_t index) const;
  const ImageShape& shape() const { return shape_; }

 private:
  ImageShape shape_;
  uint64_t seed_;
  std::vector<std::string> urls_;
};

}  // namespace moeserve::loadgen
