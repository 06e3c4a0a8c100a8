#pragma once
// The image of an OpenAI `image_url` content part: a data: URL (base64), an http(s) URL the server fetches
// (a size limit, a timeout, a few redirects, a switch to turn fetching off) or a file:// URL under the one
// directory the server allows (vLLM's --allowed-local-media-path; off by default), decoded to RGB and hashed
// by its pixels (the key the prefix cache and the router see, so a different image never shares a cached
// prefix). Every failure is an ImageError whose message suits a 400; nothing here crashes on hostile input.
// docs/vision.md.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "vision/image.h"

namespace moeserve::server {

struct ImageFetchOptions {
  bool allow_fetch = true;  // false: http(s) URLs are refused, data: URLs only
  // Encoded bytes per image: OpenAI's own limit is 20 MB per image.
  size_t max_bytes = size_t(20) << 20;
  // For the whole fetch (connect, request, response): vLLM's VLLM_IMAGE_FETCH_TIMEOUT default.
  std::chrono::milliseconds timeout{5000};
  DecodeLimits decode;
  // vLLM's --allowed-local-media-path: file:// URLs are read from under this directory only, as
  // canonical_media_dir returns it (absolute); empty: file:// URLs are refused.
  std::string allowed_local_media_path;
};

// Redirects one http(s) fetch follows (each hop within the same deadline and byte limit).
constexpr int kMaxImageRedirects = 5;

struct LoadedImage {
  Image image;
  ImageFormat format = ImageFormat::Unknown;
  std::array<uint64_t, 2> hash{};  // of the decoded pixels and size (content_hash)
};

// The bytes of a data: URL: an image/* media type and base64 data, at most max_bytes decoded.
std::vector<uint8_t> decode_data_url(std::string_view url, size_t max_bytes);

// GET of an http:// or https:// URL (certificates verified against the system's CAs): a 200 whose
// Content-Type is an image (or absent, or application/octet-stream) and whose body fits max_bytes, within
// the timeout; up to kMaxImageRedirects redirects to http(s) URLs are followed within the same timeout.
std::vector<uint8_t> fetch_url(std::string_view url, const ImageFetchOptions& options);

// The bytes of a file:///path URL (percent-escapes decoded): a regular file of at most max_bytes under
// options.allowed_local_media_path. A path that leaves the directory, by "..", or by a symbolic link
// anywhere on the way, is refused: the check is made on the file actually opened.
std::vector<uint8_t> read_file_url(std::string_view url, const ImageFetchOptions& options);

// --allowed-local-media-path's directory as ImageFetchOptions holds it (absolute, lexically normal). Throws
// moeserve::Error when it is not an existing directory.
std::string canonical_media_dir(const std::string& dir);

// 128 bits over width, height and RGB bytes (two independent 64-bit FNV-1a-style mixes).
std::array<uint64_t, 2> content_hash(const Image& image);

// Any of the above, then decode_image. `before_decode` (when given) sees the format and size the image's
// header declares before any pixel is decoded, and may throw to refuse it (a request's patch budget).
LoadedImage load_image_url(std::string_view url, const ImageFetchOptions& options,
                           const std::function<void(const ImageInfo&)>& before_decode = {});

}  // namespace moeserve::server
