// image_url content: data: URLs, http:// fetching from a real local server (served bytes, wrong types,
// errors, a body over the limit, a redirect, a server that never answers), and the content hash. Every
// failure is an ImageError with a message fit for a 400.
#include "server/image_input.h"

#include <gtest/gtest.h>

#include <memory>

#include "fake_backend.h"
#include "test_images.h"

namespace moeserve::server {
namespace {

// A 4x3 PNG of one shade.
std::string tiny_png(uint8_t shade) {
  std::vector<uint8_t> rgb(4 * 3 * 3, shade);
  return testing_images::encode_png(rgb.data(), 4, 3, 3);
}

using testing_images::base64;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ImageError& e) {
    return e.what();
  }
  return "no error";
}

// A peer on 127.0.0.1 that answers every request with `status`, `body` and `content_type`.
std::unique_ptr<peers::FakeBackend> answering(int status, std::string body, std::string content_type,
                                              std::vector<std::pair<std::string, std::string>> headers = {}) {
  return std::make_unique<peers::FakeBackend>([=](const peers::HttpRequest&, peers::BackendConnection& c) {
    c.close_after();
    c.respond(status, body, content_type, headers);
  });
}

std::string url_of(const peers::FakeBackend& server) {
  return server.url() + "/image.png";
}

TEST(ImageInput, DataUrlDecodesAndHashesByContent) {
  auto png = tiny_png(40);
  LoadedImage a = load_image_url("data:image/png;base64," + base64(png), {});
  EXPECT_EQ(a.format, ImageFormat::Png);
  EXPECT_EQ(a.image.width, 4);
  EXPECT_EQ(a.image.rgb[0], 40);
  // The declared subtype does not decide the decoder; the same pixels give the same hash.
  LoadedImage b = load_image_url("data:image/jpeg;base64," + base64(png), {});
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_NE(a.hash, load_image_url("data:image/png;base64," + base64(tiny_png(41)), {}).hash);
}

// The header's size is checked (the pixel limit, then the caller's budget) before any pixel is decoded.
TEST(ImageInput, TheHeaderIsCheckedBeforeDecoding) {
  const std::string url = "data:image/png;base64," + base64(tiny_png(7));
  ImageInfo seen;
  LoadedImage ok = load_image_url(url, {}, [&](const ImageInfo& info) { seen = info; });
  EXPECT_EQ(seen.format, ImageFormat::Png);
  EXPECT_EQ(seen.width, ok.image.width);
  EXPECT_EQ(seen.height, ok.image.height);
  EXPECT_NE(error_of([&] {
              load_image_url(url, {}, [](const ImageInfo&) { throw ImageError("over the budget"); });
            }).find("over the budget"),
            std::string::npos);
  ImageFetchOptions few;
  few.decode.max_pixels = 3;
  bool asked = false;
  EXPECT_NE(error_of([&] {
              load_image_url(url, few, [&](const ImageInfo&) { asked = true; });
            }).find("more than the limit of 3"),
            std::string::npos);
  EXPECT_FALSE(asked);  // the pixel limit comes first
}

TEST(ImageInput, BadDataUrlsAreImageErrors) {
  const std::string png64 = base64(tiny_png(1));
  EXPECT_NE(error_of([&] { load_image_url("data:text/plain;base64," + png64, {}); }).find("not image/*"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("data:image/png," + png64, {}); }).find("base64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("data:image/png;base64,@@@@", {}); }).find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("data:image/png;base64", {}); }).find("','"), std::string::npos);
  EXPECT_NE(
      error_of([&] { load_image_url("data:image/png;base64,aGVsbG8gd29ybGQ=", {}); }).find("not an image"),
      std::string::npos);
  ImageFetchOptions small;
  small.max_bytes = 16;
  EXPECT_NE(error_of([&] { load_image_url("data:image/png;base64," + png64, small); }).find("larger than 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("ftp://example.com/a.png", {}); }).find("http(s)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("http://user@example.com/a.png", {}); }).find("host"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("http://example.com:80x/a.png", {}); }).find("port"),
            std::string::npos);
}

TEST(ImageInput, FetchesAnImageFromAnHttpServer) {
  auto server = answering(200, tiny_png(77), "image/png");
  LoadedImage img = load_image_url(url_of(*server), {});
  EXPECT_EQ(img.image.rgb[0], 77);
  ASSERT_EQ(server->request_count(), 1u);
  EXPECT_EQ(server->requests()[0].method, "GET");
  EXPECT_EQ(server->requests()[0].target, "/image.png");
  ImageFetchOptions off;
  off.allow_fetch = false;
  EXPECT_NE(error_of([&] { load_image_url(url_of(*server), off); }).find("turned off"), std::string::npos);
  EXPECT_EQ(server->request_count(), 1u);  // turned off: nothing was fetched
}

TEST(ImageInput, FetchFailuresAreImageErrors) {
  auto html = answering(200, "<p>", "text/html; charset=utf-8");
  EXPECT_NE(error_of([&] { load_image_url(url_of(*html), {}); }).find("not an image"), std::string::npos);
  auto missing = answering(404, "no", "text/plain");
  EXPECT_NE(error_of([&] { load_image_url(url_of(*missing), {}); }).find("404"), std::string::npos);
  auto moved = answering(302, "", "text/plain", {{"Location", "http://elsewhere.example/x.png"}});
  EXPECT_NE(error_of([&] { load_image_url(url_of(*moved), {}); }).find("elsewhere.example"),
            std::string::npos);
  auto big = answering(200, tiny_png(5), "image/png");
  ImageFetchOptions small;
  small.max_bytes = 20;
  EXPECT_NE(error_of([&] { load_image_url(url_of(*big), small); }).find("larger than 20"), std::string::npos);
}

TEST(ImageInput, AServerThatNeverAnswersTimesOut) {
  peers::Gate answer;  // opened only as the test ends: the request stays unanswered past the fetch's timeout
  peers::FakeBackend silent([&](const peers::HttpRequest&, peers::BackendConnection& c) {
    answer.wait(60'000);
    c.close_after();
  });
  ImageFetchOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  EXPECT_NE(error_of([&] { load_image_url(url_of(silent), quick); }).find("did not finish within 300 ms"),
            std::string::npos);
  answer.open();
}

TEST(ImageInput, AnUnreachableHostIsAnImageError) {
  // Port 1 on the loopback: nothing listens there, the connect is refused.
  EXPECT_NE(error_of([&] { load_image_url("http://127.0.0.1:1/x.png", {}); }).find("failed"),
            std::string::npos);
}

}  // namespace
}  // namespace moeserve::server
