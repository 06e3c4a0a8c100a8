// Besides http_server.cpp, the server's one user of Boost.Beast/Asio: the client that fetches image URLs.
#include "server/image_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <optional>

namespace moeserve::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::string shown(std::string_view s) {
  constexpr size_t kMax = 64;
  return s.size() <= kMax ? std::string(s) : std::string(s.substr(0, kMax)) + "...";
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet some clients send
  if (c == '/' || c == '_') return 63;
  return -1;
}

struct Url {
  bool tls = false;
  std::string host, port, target;
};

Url parse_url(std::string_view url) {
  Url u;
  std::string_view rest;
  if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    rest = url.substr(8), u.tls = true;
  } else {
    throw ImageError(
        "an image URL must be a data: URL, an http(s):// URL or (where the server allows it) a "
        "file:// URL");
  }
  size_t slash = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "/" : rest.substr(slash);
  if (path.starts_with("?"))
    u.target = "/" + std::string(path);
  else
    u.target = std::string(path.substr(0, path.find('#')));
  if (u.target.empty()) u.target = "/";
  if (authority.empty() || authority.find('@') != std::string_view::npos)
    throw ImageError(fmt::format("the image URL {} has no usable host", shown(url)));
  size_t colon = authority.rfind(':');
  if (authority.starts_with("[")) {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) throw ImageError("the image URL's IPv6 host is not closed by ']'");
    u.host = std::string(authority.substr(1, close - 1));
    colon = authority.size() > close + 1 && authority[close + 1] == ':' ? close + 1 : std::string_view::npos;
  } else {
    u.host = std::string(authority.substr(0, colon));
  }
  u.port =
      colon == std::string_view::npos ? (u.tls ? "443" : "80") : std::string(authority.substr(colon + 1));
  if (u.host.empty() || u.port.empty() || u.port.size() > 5 ||
      !std::all_of(u.port.begin(), u.port.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw ImageError(fmt::format("the image URL {} has a bad host or port", shown(url)));
  return u;
}

// One exchange's outcome: the image's bytes, or the Location a redirect names.
struct Fetched {
  std::vector<uint8_t> body;
  std::optional<std::string> location;
};

// The checks on a response, shared by both schemes.
Fetched accept_response(http::response_parser<http::vector_body<uint8_t>>& parser, std::string_view url) {
  auto& res = parser.get();
  if (res.result_int() >= 300 && res.result_int() < 400) {
    if (res[http::field::location].empty())
      throw ImageError(fmt::format("fetching the image URL {} was redirected ({}) with no Location",
                                   shown(url), res.result_int()));
    return {{}, std::string(res[http::field::location])};
  }
  if (res.result_int() != 200)
    throw ImageError(fmt::format("fetching the image URL {} answered {}", shown(url), res.result_int()));
  std::string_view type = res[http::field::content_type];
  std::string lower(type.substr(0, type.find(';')));
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (!lower.empty() && !lower.starts_with("image/") && lower != "application/octet-stream")
    throw ImageError(
        fmt::format("the image URL {} returned Content-Type {}, not an image", shown(url), shown(type)));
  return {std::move(res.body()), std::nullopt};
}

template <typename Stream>
asio::awaitable<Fetched> exchange(Stream& stream, const Url& u, std::string_view url, size_t max_bytes) {
  http::request<http::empty_body> req{http::verb::get, u.target, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "moeserve");
  req.set(http::field::accept, "image/*");
  co_await http::async_write(stream, req, asio::use_awaitable);
  beast::flat_buffer buffer;
  http::response_parser<http::vector_body<uint8_t>> parser;
  parser.body_limit(max_bytes);
  try {
    co_await http::async_read(stream, buffer, parser, asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    if (e.code() == http::error::body_limit)
      throw ImageError(fmt::format("the image at {} is larger than {} bytes", shown(url), max_bytes));
    throw;
  }
  co_return accept_response(parser, url);
}

asio::awaitable<Fetched> fetch_once(const Url& u, std::string_view url, size_t max_bytes,
                                    std::optional<asio::ssl::context>& tls) {
  auto executor = co_await asio::this_coro::executor;
  asio::ip::tcp::resolver resolver(executor);
  auto endpoints = co_await resolver.async_resolve(u.host, u.port, asio::use_awaitable);
  if (!u.tls) {
    beast::tcp_stream stream(executor);
    co_await stream.async_connect(endpoints, asio::use_awaitable);
    co_return co_await exchange(stream, u, url, max_bytes);
  }
  if (!tls) {
    tls.emplace(asio::ssl::context::tls_client);
    tls->set_default_verify_paths();
    tls->set_verify_mode(asio::ssl::verify_peer);
  }
  beast::ssl_stream<beast::tcp_stream> stream(executor, *tls);
  if (!SSL_set_tlsext_host_name(stream.native_handle(), u.host.c_str()))
    throw ImageError("cannot set the TLS server name for the image URL");
  stream.set_verify_callback(asio::ssl::host_name_verification(u.host));
  co_await beast::get_lowest_layer(stream).async_connect(endpoints, asio::use_awaitable);
  co_await stream.async_handshake(asio::ssl::stream_base::client, asio::use_awaitable);
  co_return co_await exchange(stream, u, url, max_bytes);
}

// Where a redirect's Location points from `from`: an absolute http(s) URL, a scheme-relative //host/path, an
// absolute /path on the same host, or a path relative to the directory of the current one.
std::string resolve_location(const Url& from, const std::string& location) {
  if (location.starts_with("http://") || location.starts_with("https://")) return location;
  const std::string scheme = from.tls ? "https:" : "http:";
  if (location.starts_with("//")) return scheme + location;
  const bool ipv6 = from.host.find(':') != std::string::npos;
  const std::string origin = scheme + "//" + (ipv6 ? "[" + from.host + "]" : from.host) + ":" + from.port;
  if (location.find("://") != std::string::npos || location.starts_with("file:") ||
      location.starts_with("data:"))  // another scheme: never followed
    throw ImageError(
        fmt::format("the image URL was redirected to {}, which is not an http(s) URL", shown(location)));
  std::string target = location;
  if (!location.starts_with("/")) {
    const std::string path = from.target.substr(0, from.target.find('?'));
    target = path.substr(0, path.rfind('/') + 1) + location;
  }
  // "." and ".." segments go (RFC 3986's remove_dot_segments), the query and fragment kept as they are.
  const size_t end = std::min(target.find('?'), target.find('#'));
  const std::string path = target.substr(0, end);
  std::vector<std::string> segments;
  size_t at = 1;
  bool directory = false;
  while (at <= path.size()) {
    const size_t slash = std::min(path.find('/', at), path.size());
    const std::string segment = path.substr(at, slash - at);
    directory = segment == "." || segment == "..";
    if (segment == "..") {
      if (!segments.empty()) segments.pop_back();
    } else if (segment != ".") {
      segments.push_back(segment);
    }
    at = slash + 1;
  }
  std::string normal;
  for (const std::string& segment : segments) normal += "/" + segment;
  if (normal.empty() || directory) normal += "/";
  return origin + normal + (end == std::string::npos ? "" : target.substr(end));
}

// The image at `url`, following up to kMaxImageRedirects redirects; the caller's deadline and byte limit
// cover every hop.
asio::awaitable<std::vector<uint8_t>> fetch(std::string url, size_t max_bytes) {
  std::optional<asio::ssl::context> tls;  // made at the first https hop
  for (int hop = 0;; ++hop) {
    const Url u = parse_url(url);
    Fetched f = co_await fetch_once(u, url, max_bytes, tls);
    if (!f.location) co_return std::move(f.body);
    if (hop == kMaxImageRedirects)
      throw ImageError(fmt::format("fetching the image URL {} was redirected more than {} times", shown(url),
                                   kMaxImageRedirects));
    url = resolve_location(u, *f.location);
  }
}

// Whether `path` (absolute, normal) lies strictly under the directory `dir` (the same form).
bool inside(const std::string& path, const std::string& dir) {
  if (dir == "/") return path.size() > 1 && path.starts_with("/");
  return path.size() > dir.size() + 1 && path.starts_with(dir) && path[dir.size()] == '/';
}

std::string percent_decode(std::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += char(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else if (s[i] == '%') {
      throw ImageError("the file:// image URL has a malformed %-escape");
    } else {
      out += s[i];
    }
  }
  return out;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::vector<uint8_t> decode_data_url(std::string_view url, size_t max_bytes) {
  if (!url.starts_with("data:")) throw ImageError("not a data: URL");
  size_t comma = url.find(',');
  if (comma == std::string_view::npos) throw ImageError("the data: URL has no ',' before its data");
  std::string_view meta = url.substr(5, comma - 5), data = url.substr(comma + 1);
  std::string_view media = meta.substr(0, meta.find(';'));
  std::string lower(media);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (!lower.starts_with("image/"))
    throw ImageError(
        fmt::format("the data: URL's media type is {}, not image/*", shown(media.empty() ? "none" : media)));
  if (!meta.ends_with(";base64")) throw ImageError("the data: URL must be base64-encoded (';base64,')");
  // 3 bytes per 4 characters: the limit is checked before anything is decoded.
  if (data.size() / 4 * 3 > max_bytes + 3)
    throw ImageError(fmt::format("the image is larger than {} bytes", max_bytes));
  std::vector<uint8_t> out;
  out.reserve(data.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (unsigned char c : data) {
    if (c == '=') {
      ++padding;
      continue;
    }
    if (c == '\n' || c == '\r' || c == ' ') continue;
    int v = base64_value(c);
    if (v < 0 || padding > 0) throw ImageError("the data: URL's base64 data is malformed");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  if (padding > 2 || bits >= 6) throw ImageError("the data: URL's base64 data is malformed");
  if (out.size() > max_bytes) throw ImageError(fmt::format("the image is larger than {} bytes", max_bytes));
  if (out.empty()) throw ImageError("the data: URL holds no data");
  return out;
}

std::vector<uint8_t> fetch_url(std::string_view url, const ImageFetchOptions& options) {
  if (!options.allow_fetch)
    throw ImageError("fetching image URLs is turned off on this server; send the image as a data: URL");
  parse_url(url);  // a malformed URL is refused before any work
  asio::io_context io;
  std::optional<std::vector<uint8_t>> body;
  std::exception_ptr failure;
  asio::co_spawn(io, fetch(std::string(url), options.max_bytes),
                 [&](std::exception_ptr e, std::vector<uint8_t> bytes) {
                   if (e)
                     failure = e;
                   else
                     body = std::move(bytes);
                 });
  // The deadline covers the whole exchange, redirects included; what is still pending afterwards is dropped
  // with the context.
  io.run_for(options.timeout);
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const ImageError&) {
      throw;
    } catch (const std::exception& e) {
      throw ImageError(fmt::format("fetching the image URL {} failed: {}", shown(url), e.what()));
    }
  }
  if (!body)
    throw ImageError(fmt::format("fetching the image URL {} did not finish within {} ms", shown(url),
                                 options.timeout.count()));
  return std::move(*body);
}

std::string canonical_media_dir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(dir, ec);
  check(!ec && std::filesystem::is_directory(real, ec),
        "--allowed-local-media-path {}: not an existing directory{}", dir, ec ? ": " + ec.message() : "");
  return std::filesystem::absolute(dir).lexically_normal().string();
}

std::vector<uint8_t> read_file_url(std::string_view url, const ImageFetchOptions& options) {
  const std::string& dir = options.allowed_local_media_path;
  if (dir.empty())
    throw ImageError(
        "file:// image URLs are turned off on this server (its --allowed-local-media-path names the one "
        "directory they may read)");
  if (!url.starts_with("file://"))
    throw ImageError(fmt::format("the image URL {} is not a file:///path URL", shown(url)));
  std::string_view rest = url.substr(std::string_view("file://").size());
  if (rest.starts_with("localhost/")) rest.remove_prefix(std::string_view("localhost").size());
  if (!rest.starts_with("/"))
    throw ImageError(fmt::format(
        "the file:// image URL {} must name an absolute path (file:///dir/image.png)", shown(url)));
  const std::string decoded = percent_decode(rest);
  if (decoded.find('\0') != std::string::npos) throw ImageError("the file:// image URL holds a NUL byte");
  // "..": judged on the path as written, before the filesystem is touched, so that a refused path tells
  // nothing of what exists outside the directory.
  const std::string path = std::filesystem::path(decoded).lexically_normal().string();
  const auto outside = [&] {
    return ImageError(
        fmt::format("the file:// image URL {} is outside the directory this server reads "
                    "images from (--allowed-local-media-path)",
                    shown(url)));
  };
  // The directory as given or as it really is (it may sit behind a symbolic link itself).
  std::error_code ec;
  const std::string real_dir = std::filesystem::canonical(dir, ec).string();
  if (ec) throw ImageError(fmt::format("the directory for file:// image URLs is gone: {}", ec.message()));
  if (!inside(path, dir) && !inside(path, real_dir)) throw outside();
  // O_NONBLOCK: a FIFO opens at once (and is refused below as not a regular file) instead of waiting.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (fd.get() < 0)
    throw ImageError(
        fmt::format("the file:// image URL {} cannot be read: {}", shown(url), std::strerror(errno)));
  // Symbolic links: the file actually opened, every link on the way resolved, must be under the directory
  // too (checked on the open descriptor, so nothing can swap a link in between).
  char real[PATH_MAX];
  const std::string self = "/proc/self/fd/" + std::to_string(fd.get());
  const ssize_t n = ::readlink(self.c_str(), real, sizeof real - 1);
  if (n <= 0 || !inside(std::string(real, size_t(n)), real_dir)) throw outside();
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw ImageError(fmt::format("the file:// image URL {} is not a regular file", shown(url)));
  if (uint64_t(st.st_size) > options.max_bytes)
    throw ImageError(fmt::format("the image at {} is larger than {} bytes", shown(url), options.max_bytes));
  std::vector<uint8_t> bytes(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += size_t(r);
  }
  bytes.resize(got);  // a file that shrank meanwhile is decoded as it is now (and refused if truncated)
  return bytes;
}

std::array<uint64_t, 2> content_hash(const Image& image) {
  std::array<uint64_t, 2> h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  auto mix = [&](uint8_t byte) {
    h[0] = (h[0] ^ byte) * 0x100000001b3ull;
    h[1] = (h[1] ^ byte) * 0x1000000000000b3ull + 0x9e3779b97f4a7c15ull;
  };
  for (int v : {image.width, image.height})
    for (int i = 0; i < 4; ++i) mix(uint8_t(uint32_t(v) >> (8 * i)));
  for (uint8_t b : image.rgb) mix(b);
  return h;
}

LoadedImage load_image_url(std::string_view url, const ImageFetchOptions& options,
                           const std::function<void(const ImageInfo&)>& before_decode) {
  std::vector<uint8_t> bytes = url.starts_with("data:")   ? decode_data_url(url, options.max_bytes)
                               : url.starts_with("file:") ? read_file_url(url, options)
                                                          : fetch_url(url, options);
  LoadedImage out;
  out.format = sniff_image_format(bytes);
  // The header's size, before any pixel is decoded (decode_image checks it again for itself).
  const ImageInfo info = probe_image(bytes);
  if (info.width * info.height > options.decode.max_pixels) {
    throw ImageError(fmt::format("the {} image is {}x{} pixels, more than the limit of {}",
                                 image_format_name(info.format), info.width, info.height,
                                 options.decode.max_pixels));
  }
  if (before_decode) before_decode(info);
  out.image = decode_image(bytes, options.decode);
  out.hash = content_hash(out.image);
  return out;
}

}  // namespace moeserve::server
