#include "vision/image.h"

// clang-format off: jpeglib.h needs <cstdio> first.
#include <jpeglib.h>

#include <cstdio>
// clang-format on
#include <gif_lib.h>
#include <png.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <new>

namespace moeserve {
namespace {

// Every decoder writes RGBA here first; to_rgb composites it over white.
struct Rgba {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // [height][width][4]
};

void check_size(int64_t width, int64_t height, const DecodeLimits& limits, const char* format) {
  if (width <= 0 || height <= 0) throw ImageError(fmt::format("the {} image has no pixels", format));
  if (width * height > limits.max_pixels)
    throw ImageError(fmt::format("the {} image is {}x{} pixels, more than the limit of {}", format, width,
                                 height, limits.max_pixels));
}

// PIL's Image.alpha_composite of the pixel over an opaque white background, in its fixed-point arithmetic
// (libImaging/AlphaComposite.c with the destination alpha 255), so that partly transparent pixels match.
uint8_t over_white(uint32_t channel, uint32_t alpha) {
  constexpr uint32_t kBits = 7;
  uint32_t coef1 = alpha << kBits;
  uint32_t coef2 = (255u << kBits) - coef1;
  uint32_t t = channel * coef1 + 255u * coef2 + (0x80u << kBits);
  return uint8_t((((t >> 8) + t) >> 8) >> kBits);
}

Image to_rgb(const Rgba& in) {
  Image out;
  out.width = in.width;
  out.height = in.height;
  size_t n = size_t(in.width) * size_t(in.height);
  out.rgb.resize(n * 3);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &in.pixels[i * 4];
    for (int c = 0; c < 3; ++c) out.rgb[i * 3 + c] = p[3] == 255 ? p[c] : over_white(p[c], p[3]);
  }
  return out;
}

// ---- PNG ----------------------------------------------------------------------------------------------
// libpng reports errors by longjmp: decode_png_frame holds no object with a destructor, and every C++ object
// it fills lives in its caller.
struct PngInput {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
  char error[200] = {};
};

void png_read_from_memory(png_structp png, png_bytep out, size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (n > in->bytes.size() - in->offset) png_error(png, "the PNG data is truncated");
  std::memcpy(out, in->bytes.data() + in->offset, n);
  in->offset += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(in->error, sizeof in->error, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

bool decode_png_frame(PngInput& in, const DecodeLimits& limits, Rgba& out, bool& too_large) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &in, png_on_error, png_on_warning);
  if (png == nullptr) return false;
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &in, png_read_from_memory);
  png_read_info(png, info);
  int64_t width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  if (width * height > limits.max_pixels) {
    too_large = true;
    out.width = int(width), out.height = int(height);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  // PIL reads 16-bit channels by their high byte; palettes, low bit depths, gray and tRNS expand to RGBA.
  png_set_expand(png);
  png_set_strip_16(png);
  png_set_gray_to_rgb(png);
  png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
  int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(width) * 4) png_error(png, "unexpected row layout");
  bool allocated = true;
  try {
    out.pixels.resize(size_t(width) * size_t(height) * 4);
  } catch (const std::bad_alloc&) {
    allocated = false;  // png_error longjmps, which must not leave a catch handler
  }
  if (!allocated) png_error(png, "out of memory");
  out.width = int(width), out.height = int(height);
  for (int pass = 0; pass < passes; ++pass)
    for (int64_t y = 0; y < height; ++y)
      png_read_row(png, &out.pixels[size_t(y) * size_t(width) * 4], nullptr);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

Image decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  PngInput in{bytes};
  Rgba frame;
  bool too_large = false;
  if (!decode_png_frame(in, limits, frame, too_large)) {
    if (too_large) check_size(frame.width, frame.height, limits, "PNG");
    throw ImageError(
        fmt::format("the PNG image cannot be decoded: {}", in.error[0] ? in.error : "libpng failed"));
  }
  return to_rgb(frame);
}

// ---- JPEG ---------------------------------------------------------------------------------------------
// libjpeg reports errors through error_exit, which must not return: it longjmps back to decode_jpeg_frame,
// which, like decode_png_frame, owns no object with a destructor.
struct JpegErrors {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_on_message(j_common_ptr, int) {}

// CMYK as PIL converts it (Convert.c cmyk2rgb), after undoing Adobe's inverted storage.
uint8_t cmyk_channel(uint32_t c, uint32_t k) {
  uint32_t t = (255 - k) * c + 128;
  return uint8_t(255 - k - (((t >> 8) + t) >> 8));
}

// header_only: out gets the size and no pixels (probe_image).
bool decode_jpeg_frame(std::span<const uint8_t> bytes, const DecodeLimits& limits, JpegErrors& errors,
                       Rgba& out, bool& too_large, bool header_only = false) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors.base);
  errors.base.error_exit = jpeg_on_error;
  errors.base.emit_message = jpeg_on_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  int64_t width = cinfo.image_width, height = cinfo.image_height;
  if (header_only) {
    out.width = int(width), out.height = int(height);
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  if (width * height > limits.max_pixels) {
    too_large = true;
    out.width = int(width), out.height = int(height);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGBA;
  jpeg_start_decompress(&cinfo);
  try {
    out.pixels.resize(size_t(width) * size_t(height) * 4);
  } catch (const std::bad_alloc&) {
    std::snprintf(errors.message, sizeof errors.message, "out of memory");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  out.width = int(width), out.height = int(height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = &out.pixels[size_t(cinfo.output_scanline) * size_t(width) * 4];
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  if (cmyk) {
    bool inverted = cinfo.saw_Adobe_marker;
    for (size_t i = 0; i < out.pixels.size(); i += 4) {
      uint8_t* p = &out.pixels[i];
      uint32_t c = p[0], m = p[1], y = p[2], k = p[3];
      if (inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
      p[0] = cmyk_channel(c, k), p[1] = cmyk_channel(m, k), p[2] = cmyk_channel(y, k), p[3] = 255;
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

Image decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  JpegErrors errors;
  Rgba frame;
  bool too_large = false;
  if (!decode_jpeg_frame(bytes, limits, errors, frame, too_large)) {
    if (too_large) check_size(frame.width, frame.height, limits, "JPEG");
    throw ImageError(fmt::format("the JPEG image cannot be decoded: {}", errors.message));
  }
  return to_rgb(frame);
}

// ---- WebP ---------------------------------------------------------------------------------------------
Image decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(bytes.data(), bytes.size(), &features) != VP8_STATUS_OK)
    throw ImageError("the WebP image cannot be decoded: bad header");
  check_size(features.width, features.height, limits, "WebP");
  Rgba frame;
  frame.width = features.width, frame.height = features.height;
  frame.pixels.resize(size_t(frame.width) * size_t(frame.height) * 4);
  if (!features.has_animation) {
    if (WebPDecodeRGBAInto(bytes.data(), bytes.size(), frame.pixels.data(), frame.pixels.size(),
                           frame.width * 4) == nullptr)
      throw ImageError("the WebP image cannot be decoded: corrupt data");
    return to_rgb(frame);
  }
  // An animation: the first frame as the demuxer composes it onto the canvas (what PIL shows as frame 0).
  WebPData data{bytes.data(), bytes.size()};
  WebPAnimDecoderOptions options;
  WebPAnimDecoderOptionsInit(&options);
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  std::unique_ptr<WebPAnimDecoder, void (*)(WebPAnimDecoder*)> decoder(WebPAnimDecoderNew(&data, &options),
                                                                       WebPAnimDecoderDelete);
  WebPAnimInfo info;
  uint8_t* canvas = nullptr;
  int timestamp = 0;
  if (!decoder || !WebPAnimDecoderGetInfo(decoder.get(), &info) || int(info.canvas_width) != frame.width ||
      int(info.canvas_height) != frame.height || !WebPAnimDecoderGetNext(decoder.get(), &canvas, &timestamp))
    throw ImageError("the animated WebP image cannot be decoded");
  std::memcpy(frame.pixels.data(), canvas, frame.pixels.size());
  return to_rgb(frame);
}

// ---- GIF ----------------------------------------------------------------------------------------------
struct GifInput {
  std::span<const uint8_t> bytes;
  size_t offset = 0;
};

int gif_read_from_memory(GifFileType* gif, GifByteType* out, int n) {
  auto* in = static_cast<GifInput*>(gif->UserData);
  size_t take = std::min(size_t(std::max(n, 0)), in->bytes.size() - in->offset);
  std::memcpy(out, in->bytes.data() + in->offset, take);
  in->offset += take;
  return int(take);
}

[[noreturn]] void gif_fail(int code) {
  const char* why = GifErrorString(code);
  throw ImageError(fmt::format("the GIF image cannot be decoded: {}", why ? why : "giflib failed"));
}

// The first frame on its canvas; pixels the frame does not cover, and its transparent index, are
// transparent (white after compositing).
Image decode_gif(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  GifInput in{bytes};
  int code = 0;
  auto close = [](GifFileType* g) {
    int ignored = 0;
    DGifCloseFile(g, &ignored);
  };
  std::unique_ptr<GifFileType, decltype(close)> gif(DGifOpen(&in, gif_read_from_memory, &code), close);
  if (!gif) gif_fail(code);
  check_size(gif->SWidth, gif->SHeight, limits, "GIF");
  Rgba frame;
  frame.width = gif->SWidth, frame.height = gif->SHeight;
  frame.pixels.assign(size_t(frame.width) * size_t(frame.height) * 4, 0);
  int transparent = NO_TRANSPARENT_COLOR;
  for (;;) {
    GifRecordType record;
    if (DGifGetRecordType(gif.get(), &record) == GIF_ERROR) gif_fail(gif->Error);
    if (record == TERMINATE_RECORD_TYPE) throw ImageError("the GIF image has no frame");
    if (record == EXTENSION_RECORD_TYPE) {
      int kind = 0;
      GifByteType* block = nullptr;
      if (DGifGetExtension(gif.get(), &kind, &block) == GIF_ERROR) gif_fail(gif->Error);
      if (kind == GRAPHICS_EXT_FUNC_CODE && block != nullptr) {
        GraphicsControlBlock gcb;
        if (DGifExtensionToGCB(block[0], block + 1, &gcb) == GIF_OK) transparent = gcb.TransparentColor;
      }
      while (block != nullptr)
        if (DGifGetExtensionNext(gif.get(), &block) == GIF_ERROR) gif_fail(gif->Error);
      continue;
    }
    if (record != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) gif_fail(gif->Error);
    const GifImageDesc& desc = gif->Image;
    const ColorMapObject* colors = desc.ColorMap ? desc.ColorMap : gif->SColorMap;
    if (colors == nullptr) throw ImageError("the GIF image has no color table");
    if (desc.Width <= 0 || desc.Height <= 0 || int64_t(desc.Width) * desc.Height > limits.max_pixels)
      throw ImageError("the GIF frame has a bad size");
    std::vector<GifPixelType> line(size_t(desc.Width));
    // Interlaced frames store rows in four passes: every 8th from 0, every 8th from 4, every 4th from 2,
    // every 2nd from 1.
    static constexpr int kStart[] = {0, 4, 2, 1}, kStep[] = {8, 8, 4, 2};
    int passes = desc.Interlace ? 4 : 1;
    for (int pass = 0; pass < passes; ++pass) {
      int start = desc.Interlace ? kStart[pass] : 0, step = desc.Interlace ? kStep[pass] : 1;
      for (int row = start; row < desc.Height; row += step) {
        if (DGifGetLine(gif.get(), line.data(), desc.Width) == GIF_ERROR) gif_fail(gif->Error);
        int y = desc.Top + row;
        if (y < 0 || y >= frame.height) continue;
        for (int col = 0; col < desc.Width; ++col) {
          int x = desc.Left + col, index = line[size_t(col)];
          if (x < 0 || x >= frame.width || index == transparent) continue;
          uint8_t* p = &frame.pixels[(size_t(y) * size_t(frame.width) + size_t(x)) * 4];
          if (index < colors->ColorCount) {
            const GifColorType& c = colors->Colors[index];
            p[0] = c.Red, p[1] = c.Green, p[2] = c.Blue;
          }
          p[3] = 255;
        }
      }
    }
    return to_rgb(frame);
  }
}

uint32_t big_endian32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

}  // namespace

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  auto starts = [&](std::string_view magic, size_t at = 0) {
    return b.size() >= at + magic.size() && std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n")) return ImageFormat::Png;
  if (starts("\xff\xd8\xff")) return ImageFormat::Jpeg;
  if (starts("RIFF") && starts("WEBP", 8)) return ImageFormat::WebP;
  if (starts("GIF87a") || starts("GIF89a")) return ImageFormat::Gif;
  return ImageFormat::Unknown;
}

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::Png:
      return "PNG";
    case ImageFormat::Jpeg:
      return "JPEG";
    case ImageFormat::WebP:
      return "WebP";
    case ImageFormat::Gif:
      return "GIF";
    case ImageFormat::Unknown:
      break;
  }
  return "unknown";
}

Image decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  switch (sniff_image_format(bytes)) {
    case ImageFormat::Png:
      return decode_png(bytes, limits);
    case ImageFormat::Jpeg:
      return decode_jpeg(bytes, limits);
    case ImageFormat::WebP:
      return decode_webp(bytes, limits);
    case ImageFormat::Gif:
      return decode_gif(bytes, limits);
    case ImageFormat::Unknown:
      break;
  }
  throw ImageError("the data is not an image in a supported format (PNG, JPEG, WebP, GIF)");
}

ImageInfo probe_image(std::span<const uint8_t> bytes) {
  ImageInfo info{sniff_image_format(bytes)};
  const char* name = image_format_name(info.format);
  switch (info.format) {
    case ImageFormat::Png:  // the IHDR chunk comes first: length, "IHDR", width, height (big-endian)
      if (bytes.size() < 24 || std::memcmp(bytes.data() + 12, "IHDR", 4) != 0)
        throw ImageError("the PNG image has no IHDR header");
      info.width = big_endian32(&bytes[16]), info.height = big_endian32(&bytes[20]);
      break;
    case ImageFormat::Jpeg: {
      JpegErrors errors;
      Rgba frame;
      bool too_large = false;
      if (!decode_jpeg_frame(bytes, {}, errors, frame, too_large, /*header_only=*/true))
        throw ImageError(fmt::format("the JPEG image cannot be decoded: {}", errors.message));
      info.width = frame.width, info.height = frame.height;
      break;
    }
    case ImageFormat::WebP: {
      WebPBitstreamFeatures features;
      if (WebPGetFeatures(bytes.data(), bytes.size(), &features) != VP8_STATUS_OK)
        throw ImageError("the WebP image cannot be decoded: bad header");
      info.width = features.width, info.height = features.height;
      break;
    }
    case ImageFormat::Gif:  // the logical screen (the canvas): width, height little-endian after the magic
      if (bytes.size() < 10) throw ImageError("the GIF image has no screen descriptor");
      info.width = bytes[6] | bytes[7] << 8, info.height = bytes[8] | bytes[9] << 8;
      break;
    case ImageFormat::Unknown:
      throw ImageError("the data is not an image in a supported format (PNG, JPEG, WebP, GIF)");
  }
  if (info.width <= 0 || info.height <= 0) throw ImageError(fmt::format("the {} image has no pixels", name));
  return info;
}

}  // namespace moeserve
