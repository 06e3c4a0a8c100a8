// Decoding: images written by the formats' own encoders (libpng, libjpeg, libwebp, giflib) come back as the
// pixels written (lossless formats exactly, JPEG closely); transparency is composited over white as PIL does;
// corrupt, truncated, unknown and oversized input is an ImageError, never a crash.
#include <gtest/gtest.h>

// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <gif_lib.h>
#include <png.h>
#include <webp/encode.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "vision/image.h"

namespace moeserve {
namespace {

// A deterministic RGB test card: gradients and a few hard edges.
Image test_card(int width, int height) {
  Image img{width, height, std::vector<uint8_t>(size_t(width) * size_t(height) * 3)};
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &img.rgb[(size_t(y) * size_t(width) + size_t(x)) * 3];
      p[0] = uint8_t(x * 255 / std::max(1, width - 1));
      p[1] = uint8_t(y * 255 / std::max(1, height - 1));
      p[2] = uint8_t(((x / 8 + y / 8) % 2) ? 230 : 20);
    }
  return img;
}

std::vector<uint8_t> encode_png(const std::vector<uint8_t>& pixels, int width, int height, bool alpha) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = uint32_t(width);
  image.height = uint32_t(height);
  image.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr));
  std::vector<uint8_t> out(size);
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = JDIMENSION(img.width);
  cinfo.image_height = JDIMENSION(img.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&img.rgb[size_t(cinfo.next_scanline) * size_t(img.width) * 3]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

int gif_write_to_vector(GifFileType* gif, const GifByteType* data, int n) {
  auto* out = static_cast<std::vector<uint8_t>*>(gif->UserData);
  out->insert(out->end(), data, data + n);
  return n;
}

// A GIF whose canvas is larger than its one frame; palette index 3 is transparent.
std::vector<uint8_t> encode_gif(int canvas_w, int canvas_h, int left, int top, int w, int h, bool interlace,
                                const std::vector<GifPixelType>& indices) {
  std::vector<uint8_t> out;
  int error = 0;
  GifFileType* gif = EGifOpen(&out, gif_write_to_vector, &error);
  EXPECT_NE(gif, nullptr);
  GifColorType colors[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 9, 9}};
  ColorMapObject* map = GifMakeMapObject(4, colors);
  EGifSetGifVersion(gif, true);
  EXPECT_EQ(EGifPutScreenDesc(gif, canvas_w, canvas_h, 2, 0, map), GIF_OK);
  GraphicsControlBlock gcb{DISPOSAL_UNSPECIFIED, false, 0, 3};
  GifByteType ext[4];
  size_t len = EGifGCBToExtension(&gcb, ext);
  EXPECT_EQ(EGifPutExtension(gif, GRAPHICS_EXT_FUNC_CODE, int(len), ext), GIF_OK);
  EXPECT_EQ(EGifPutImageDesc(gif, left, top, w, h, interlace, nullptr), GIF_OK);
  // Interlaced frames are written in the four-pass row order.
  std::vector<int> rows;
  if (interlace) {
    for (int start : {0, 4, 2, 1})
      for (int r = start; r < h; r += (start == 0 || start == 4) ? 8 : start == 2 ? 4 : 2) rows.push_back(r);
  } else {
    for (int r = 0; r < h; ++r) rows.push_back(r);
  }
  for (int r : rows)
    EXPECT_EQ(EGifPutLine(gif, const_cast<GifPixelType*>(&indices[size_t(r) * size_t(w)]), w), GIF_OK);
  EGifCloseFile(gif, &error);
  GifFreeMapObject(map);
  return out;
}

TEST(DecodeImage, PngRoundTripsExactly) {
  Image card = test_card(37, 23);
  Image back = decode_image(encode_png(card.rgb, card.width, card.height, false));
  EXPECT_EQ(back.width, 37);
  EXPECT_EQ(back.height, 23);
  EXPECT_EQ(back.rgb, card.rgb);
}

TEST(DecodeImage, PngAlphaIsCompositedOverWhiteAsPilDoes) {
  // Pixels (r, g, b, a): opaque, fully transparent, and half transparent black / white / grey.
  std::vector<uint8_t> rgba = {10, 20,  30,  255, 10,  20,  30,  0,   0,   0,
                               0,  128, 255, 255, 255, 128, 100, 100, 100, 64};
  Image back = decode_image(encode_png(rgba, 5, 1, true));
  // PIL: Image.alpha_composite(white, im).convert("RGB") gives 127 for black at alpha 128, and
  // 100*64/255 + 255*(191/255) ≈ 216 for grey at 64.
  std::vector<uint8_t> want = {10, 20, 30, 255, 255, 255, 127, 127, 127, 255, 255, 255, 216, 216, 216};
  EXPECT_EQ(back.rgb, want);
}

TEST(DecodeImage, JpegDecodesCloseToWhatWasEncoded) {
  // Smooth content: JPEG's 4:2:0 chroma subsampling blurs the test card's hard colour edges.
  Image card = test_card(64, 48);
  for (size_t i = 2; i < card.rgb.size(); i += 3)
    card.rgb[i] = uint8_t((card.rgb[i - 2] + card.rgb[i - 1]) / 2);
  Image back = decode_image(encode_jpeg(card, 95));
  ASSERT_EQ(back.width, 64);
  ASSERT_EQ(back.height, 48);
  double total = 0;
  for (size_t i = 0; i < card.rgb.size(); ++i) total += std::abs(int(back.rgb[i]) - int(card.rgb[i]));
  EXPECT_LT(total / double(card.rgb.size()), 2.0);
  EXPECT_GT(total, 0.0);  // lossy: a decoder that returned the input would be suspicious
}

TEST(DecodeImage, WebPLosslessRoundTripsExactly) {
  Image card = test_card(33, 17);
  uint8_t* encoded = nullptr;
  size_t size = WebPEncodeLosslessRGB(card.rgb.data(), card.width, card.height, card.width * 3, &encoded);
  ASSERT_GT(size, 0u);
  std::vector<uint8_t> bytes(encoded, encoded + size);
  WebPFree(encoded);
  EXPECT_EQ(sniff_image_format(bytes), ImageFormat::WebP);
  Image back = decode_image(bytes);
  EXPECT_EQ(back.width, 33);
  EXPECT_EQ(back.height, 17);
  EXPECT_EQ(back.rgb, card.rgb);
}

TEST(DecodeImage, GifFirstFrameOnItsCanvasWithTransparencyAsWhite) {
  for (bool interlace : {false, true}) {
    // A 3x10 frame at (1, 2) on a 6x14 canvas: row r holds index r % 4 (3 is transparent).
    const int w = 3, h = 10;
    std::vector<GifPixelType> indices(size_t(w * h));
    for (int r = 0; r < h; ++r)
      for (int c = 0; c < w; ++c) indices[size_t(r * w + c)] = GifPixelType(r % 4);
    Image back = decode_image(encode_gif(6, 14, 1, 2, w, h, interlace, indices));
    ASSERT_EQ(back.width, 6);
    ASSERT_EQ(back.height, 14);
    const uint8_t palette[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}};
    for (int y = 0; y < 14; ++y)
      for (int x = 0; x < 6; ++x) {
        bool inside = x >= 1 && x < 1 + w && y >= 2 && y < 2 + h;
        const uint8_t* want = inside ? palette[(y - 2) % 4] : palette[3];
        const uint8_t* got = &back.rgb[size_t(y * 6 + x) * 3];
        ASSERT_EQ(std::vector<uint8_t>(got, got + 3), std::vector<uint8_t>(want, want + 3))
            << "x=" << x << " y=" << y << " interlace=" << interlace;
      }
  }
}

TEST(DecodeImage, UnknownCorruptAndTruncatedInputIsAnImageError) {
  Image card = test_card(40, 40);
  std::vector<uint8_t> png = encode_png(card.rgb, 40, 40, false), jpeg = encode_jpeg(card, 80);
  std::vector<std::vector<uint8_t>> bad = {
      {},
      {'h', 'e', 'l', 'l', 'o'},
      std::vector<uint8_t>(png.begin(), png.begin() + 40),
      std::vector<uint8_t>(png.begin(), png.begin() + long(png.size() / 2)),
      std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 30),
      {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', ' '},
      {'G', 'I', 'F', '8', '9', 'a', 1},
  };
  std::vector<uint8_t> flipped = png;
  for (size_t i = 60; i < flipped.size(); i += 7) flipped[i] ^= 0x5a;
  bad.push_back(flipped);
  for (size_t i = 0; i < bad.size(); ++i) EXPECT_THROW(decode_image(bad[i]), ImageError) << "case " << i;
}

TEST(DecodeImage, MutatedFilesOfEveryFormatDecodeOrFailCleanly) {
  // Seeded byte flips, truncations and splices of a valid file of each format: each either decodes to the
  // size its header declares (the size probe_image reads) or throws ImageError; probe_image too gives a
  // size or throws ImageError (a crash or another exception fails the test).
  Image card = test_card(24, 16);
  uint8_t* webp = nullptr;
  size_t webp_size = WebPEncodeLosslessRGB(card.rgb.data(), card.width, card.height, card.width * 3, &webp);
  std::vector<GifPixelType> indices(size_t(6 * 5), 1);
  std::vector<std::vector<uint8_t>> seeds = {
      encode_png(card.rgb, card.width, card.height, false), encode_jpeg(card, 75),
      std::vector<uint8_t>(webp, webp + webp_size), encode_gif(8, 8, 1, 1, 6, 5, true, indices)};
  WebPFree(webp);
  std::mt19937 rng(20);
  int decoded = 0, refused = 0;
  for (const auto& seed : seeds) {
    for (int round = 0; round < 4000; ++round) {
      std::vector<uint8_t> bytes = seed;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % bytes.size();
        switch (rng() % 4) {
          case 0:
            bytes[at] ^= uint8_t(1 + rng() % 255);
            break;
          case 1:
            bytes.resize(std::max<size_t>(at, 1));
            break;
          case 2:
            bytes.insert(bytes.begin() + long(at), uint8_t(rng()));
            break;
          default:
            bytes[at] = 0xff;
            break;
        }
      }
      try {
        Image img = decode_image(bytes, DecodeLimits{1 << 20});
        EXPECT_EQ(img.rgb.size(), size_t(img.width) * size_t(img.height) * 3);
        ++decoded;
        // What the server budgets from the header is what the decoder made.
        ImageInfo info = probe_image(bytes);
        EXPECT_EQ(info.width, img.width);
        EXPECT_EQ(info.height, img.height);
      } catch (const ImageError&) {
        ++refused;
      }
      try {
        ImageInfo info = probe_image(bytes);
        EXPECT_GT(info.width, 0);
        EXPECT_GT(info.height, 0);
      } catch (const ImageError&) {
      }
    }
  }
  EXPECT_GT(decoded, 0);  // the mutations reach past the headers
  EXPECT_GT(refused, 0);
}

TEST(DecodeImage, RefusesMorePixelsThanTheLimitBeforeDecoding) {
  Image card = test_card(300, 200);
  std::vector<uint8_t> png = encode_png(card.rgb, 300, 200, false), jpeg = encode_jpeg(card, 80);
  DecodeLimits limits{50'000};
  for (const auto* bytes : {&png, &jpeg}) {
    try {
      decode_image(*bytes, limits);
      ADD_FAILURE() << "decoded past the limit";
    } catch (const ImageError& e) {
      EXPECT_NE(std::string(e.what()).find("300x200"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(decode_image(png, DecodeLimits{60'000}));
}

// probe_image reads each format's declared size from its header alone: the same size decode_image gives, and
// the size of a header whose pixel data never follows.
TEST(ProbeImage, HeadersGiveTheSizeOfEveryFormatWithoutDecoding) {
  Image card = test_card(45, 31);
  std::vector<uint8_t> png = encode_png(card.rgb, 45, 31, false), jpeg = encode_jpeg(card, 80);
  uint8_t* encoded = nullptr;
  size_t size = WebPEncodeLosslessRGB(card.rgb.data(), 45, 31, 45 * 3, &encoded);
  std::vector<uint8_t> webp(encoded, encoded + size);
  WebPFree(encoded);
  std::vector<uint8_t> gif = encode_gif(45, 31, 2, 3, 4, 5, false, std::vector<GifPixelType>(20, 1));
  const std::pair<const std::vector<uint8_t>*, ImageFormat> cases[] = {{&png, ImageFormat::Png},
                                                                       {&jpeg, ImageFormat::Jpeg},
                                                                       {&webp, ImageFormat::WebP},
                                                                       {&gif, ImageFormat::Gif}};
  for (const auto& [bytes, format] : cases) {
    ImageInfo info = probe_image(*bytes);
    EXPECT_EQ(info.format, format);
    EXPECT_EQ(info.width, 45) << image_format_name(format);
    EXPECT_EQ(info.height, 31) << image_format_name(format);
    Image decoded = decode_image(*bytes);
    EXPECT_EQ(decoded.width, info.width);
    EXPECT_EQ(decoded.height, info.height);
  }
  // Cut after the headers: the size is there, the pixels are not.
  std::vector<uint8_t> png_head(png.begin(), png.begin() + 33);
  EXPECT_EQ(probe_image(png_head).width, 45);
  EXPECT_THROW(decode_image(png_head), ImageError);
  std::vector<uint8_t> gif_head(gif.begin(), gif.begin() + 13);
  EXPECT_EQ(probe_image(gif_head).height, 31);
  for (const auto& bad :
       std::vector<std::vector<uint8_t>>{{},
                                         {'h', 'i'},
                                         std::vector<uint8_t>(png.begin(), png.begin() + 20),
                                         std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + 4),
                                         {'G', 'I', 'F', '8', '9', 'a', 1}})
    EXPECT_THROW(probe_image(bad), ImageError);
}

}  // namespace
}  // namespace moeserve
