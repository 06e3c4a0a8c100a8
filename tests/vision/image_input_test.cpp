// image_url content: data: URLs, http:// fetching from a real local server (served bytes, wrong types,
// errors, a body over the limit, redirects followed up to a bound, a server that never answers), file://
// URLs under --allowed-local-media-path only, and the content hash. Every failure is an ImageError with a
// message fit for a 400.
#include "server/image_input.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
  auto big = answering(200, tiny_png(5), "image/png");
  ImageFetchOptions small;
  small.max_bytes = 20;
  EXPECT_NE(error_of([&] { load_image_url(url_of(*big), small); }).find("larger than 20"), std::string::npos);
}

// Redirects are followed (absolute, scheme-relative, absolute-path and relative Locations) up to
// kMaxImageRedirects, each hop under the same byte limit and the one deadline; a loop, a redirect to
// another scheme and a redirect without a Location are errors.
TEST(ImageInput, RedirectsAreFollowedUpToABound) {
  const std::string png = tiny_png(42);
  std::string base;
  peers::FakeBackend server([&](const peers::HttpRequest& r, peers::BackendConnection& c) {
    auto redirect = [&](const std::string& to) { c.respond(302, "", "text/plain", {{"Location", to}}); };
    if (r.target == "/a/start.png") return redirect(base + "/b/next.png");             // absolute
    if (r.target == "/b/next.png") return redirect("/c/dir/third.png");                // absolute path
    if (r.target == "/c/dir/third.png") return redirect("../final.png?v=1");           // relative
    if (r.target == "/c/final.png?v=1") return redirect(base.substr(5) + "/img.png");  // //host/path
    if (r.target == "/img.png") return (void)c.respond(200, png, "image/png");
    if (r.target == "/loop.png") return redirect("/loop.png");
    if (r.target == "/elsewhere.png") return redirect("file:///etc/passwd");
    if (r.target == "/nowhere.png") return (void)c.respond(301, "", "text/plain");
    if (r.target == "/big.png") return redirect("/big-body.png");
    if (r.target == "/big-body.png") return (void)c.respond(200, std::string(4096, 'x'), "image/png");
    c.respond(404, "", "text/plain");
  });
  base = server.url();
  LoadedImage img = load_image_url(base + "/a/start.png", {});
  EXPECT_EQ(img.image.rgb[0], 42);
  EXPECT_EQ(server.request_count(), 5u);  // four redirects, the image: within kMaxImageRedirects
  static_assert(kMaxImageRedirects == 5);

  EXPECT_NE(error_of([&] { load_image_url(base + "/loop.png", {}); }).find("redirected more than 5 times"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url(base + "/elsewhere.png", {}); }).find("not an http(s) URL"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url(base + "/nowhere.png", {}); }).find("no Location"),
            std::string::npos);
  ImageFetchOptions small;
  small.max_bytes = 1000;
  EXPECT_NE(error_of([&] { load_image_url(base + "/big.png", small); }).find("larger than 1000"),
            std::string::npos);
  // A redirect to a server that never answers ends at the one deadline.
  peers::Gate answer;  // opened only as the test ends: the request stays unanswered past the fetch's timeout
  peers::FakeBackend silent([&](const peers::HttpRequest&, peers::BackendConnection& c) {
    answer.wait(60'000);
    c.close_after();
  });
  peers::FakeBackend to_silent([&](const peers::HttpRequest&, peers::BackendConnection& c) {
    c.respond(307, "", "text/plain", {{"Location", url_of(silent)}});
  });
  ImageFetchOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  EXPECT_NE(error_of([&] { load_image_url(to_silent.url() + "/x.png", quick); }).find("within 300 ms"),
            std::string::npos);
  answer.open();
}

// file:// URLs: refused unless the server names a directory; then read from under it only. "..", a
// symbolic link out of it (to a file, or a directory on the way), a directory, a FIFO and a file over the
// byte limit are refused with an error that says why.
TEST(ImageInput, FileUrlsAreReadFromTheAllowedDirectoryOnly) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("moeserve-media-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "media" / "sub");
  fs::create_directories(root / "secret");
  auto write = [](const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  };
  write(root / "media" / "sub" / "a b.png", tiny_png(9));
  write(root / "secret" / "s.png", tiny_png(200));
  fs::create_symlink(root / "secret" / "s.png", root / "media" / "link.png");
  fs::create_directory_symlink(root / "secret", root / "media" / "dirlink");
  ASSERT_EQ(::mkfifo((root / "media" / "fifo.png").c_str(), 0600), 0);
  const std::string media = (root / "media").string();

  ImageFetchOptions off;
  EXPECT_NE(error_of([&] { load_image_url("file://" + media + "/sub/a%20b.png", off); }).find("turned off"),
            std::string::npos);
  ImageFetchOptions on;
  on.allowed_local_media_path = canonical_media_dir(media + "/sub/..");
  EXPECT_EQ(load_image_url("file://" + media + "/sub/a%20b.png", on).image.rgb[0], 9);
  EXPECT_EQ(load_image_url("file://localhost" + media + "/sub/a%20b.png", on).image.rgb[0], 9);
  for (const char* escape :
       {"/sub/../../secret/s.png", "/link.png", "/dirlink/s.png", "/%2e%2e/secret/s.png", "/.."}) {
    EXPECT_NE(error_of([&] { load_image_url("file://" + media + escape, on); }).find("outside the directory"),
              std::string::npos)
        << escape;
  }
  EXPECT_NE(error_of([&] {
              load_image_url("file://" + (root / "secret" / "s.png").string(), on);
            }).find("outside the directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("file://" + media + "/sub", on); }).find("not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("file://" + media + "/fifo.png", on); }).find("not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("file://" + media + "/none.png", on); }).find("cannot be read"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_url("file://relative/x.png", on); }).find("absolute path"),
            std::string::npos);
  ImageFetchOptions tight = on;
  tight.max_bytes = 10;
  EXPECT_NE(
      error_of([&] { load_image_url("file://" + media + "/sub/a%20b.png", tight); }).find("larger than 10"),
      std::string::npos);
  // The directory itself behind a symbolic link: URLs through the link or the real path both reach it.
  fs::create_directory_symlink(root / "media", root / "alias");
  ImageFetchOptions aliased;
  aliased.allowed_local_media_path = canonical_media_dir((root / "alias").string());
  EXPECT_EQ(load_image_url("file://" + (root / "alias" / "sub" / "a%20b.png").string(), aliased).image.rgb[0],
            9);
  EXPECT_EQ(load_image_url("file://" + media + "/sub/a%20b.png", aliased).image.rgb[0], 9);
  EXPECT_NE(error_of([&] {
              load_image_url("file://" + (root / "alias" / "link.png").string(), aliased);
            }).find("outside the directory"),
            std::string::npos);
  EXPECT_THROW(canonical_media_dir((root / "missing").string()), Error);
  fs::remove_all(root);
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
