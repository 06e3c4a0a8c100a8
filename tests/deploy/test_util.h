#pragma once
// Helpers for the deploy tests: temporary directories, finding real tools (promtool, nginx, systemd-analyze;
// run_command is the peer library's) and reading files.

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "child_process.h"
#include "fake_backend.h"
#include "http_client.h"
#include "loopback.h"
#include "run_process.h"

namespace moeserve::deploy::testing {

// Bytes of tensor data a safetensors file holds, from its header (the real size a server loads).
inline double safetensors_payload(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), std::streamsize(header_len));
  const auto h = nlohmann::json::parse(header);
  double total = 0;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    auto offsets = t.at("data_offsets");
    total += double(offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>());
  }
  return total;
}

// The path of a tool, or "" (callers fail the test naming the package that provides it).
inline std::string find_tool(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin"}) {
    std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moeserve-deploy-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_file(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

// Metric names a PromQL expression reads: identifiers of our namespaces, without the histogram suffixes.
inline std::set<std::string> metrics_in(const std::string& expr) {
  std::set<std::string> out;
  static const std::regex ident(R"((moeserve:[A-Za-z0-9_:]+|moeserve_router_[A-Za-z0-9_]+))");
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), ident); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.ends_with(suffix) && name.find("_seconds") != std::string::npos)
        name = name.substr(0, name.size() - std::strlen(suffix));
    out.insert(name);
  }
  return out;
}

// Child processes, the HTTP client and free ports: the peer library's (tests/peers).
using namespace peers;

}  // namespace moeserve::deploy::testing
