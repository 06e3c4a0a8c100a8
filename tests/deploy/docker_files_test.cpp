// No Docker engine runs here, so the Dockerfiles and compose files are checked the way a reviewer would: a
// small Dockerfile reader (continuations, stages, ARG scopes) verifies base images, platforms, CUDA
// architectures, referenced files, build arguments and CMake options against the repository.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "deploy/cluster_spec.h"
#include "deploy/gpus.h"
#include "deploy/structured_file.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using testing::read_file;

struct Instruction {
  std::string keyword;  // upper case
  std::string args;
  int line = 0;
};

struct Dockerfile {
  std::vector<Instruction> instructions;
  std::map<std::string, std::string> global_args;  // ARGs before the first FROM, with defaults
};

Dockerfile parse_dockerfile(const std::string& path) {
  Dockerfile d;
  std::istringstream in(read_file(path));
  std::string line, pending;
  int number = 0, start = 0;
  while (std::getline(in, line)) {
    ++number;
    std::string t = line;
    t.erase(0, t.find_first_not_of(" \t"));
    if (t.empty() || t[0] == '#') continue;  // comments and blank lines, also between continuations
    if (pending.empty()) start = number;
    if (!t.empty() && t.back() == '\\') {
      pending += t.substr(0, t.size() - 1) + " ";
      continue;
    }
    pending += t;
    auto space = pending.find(' ');
    Instruction ins{pending.substr(0, space), space == std::string::npos ? "" : pending.substr(space + 1),
                    start};
    for (char& ch : ins.keyword) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    d.instructions.push_back(ins);
    pending.clear();
  }
  EXPECT_TRUE(pending.empty()) << path << ": a continuation runs off the end";
  bool before_from = true;
  for (const auto& i : d.instructions) {
    if (i.keyword == "FROM") before_from = false;
    if (i.keyword == "ARG" && before_from) {
      auto eq = i.args.find('=');
      d.global_args[i.args.substr(0, eq)] = eq == std::string::npos ? "" : i.args.substr(eq + 1);
    }
  }
  return d;
}

std::set<std::string> brace_refs(const std::string& s) {
  std::set<std::string> out;
  static const std::regex ref(R"(\$\{([A-Za-z_][A-Za-z0-9_]*))");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), ref); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1]);
  return out;
}

struct Expect {
  std::string file, platform, cuda_archs, arch;
};
const Expect kDockerfiles[] = {
    {"deploy/docker/Dockerfile.x86_64-sm90", "linux/amd64", "90a", "x86_64"},
    {"deploy/docker/Dockerfile.aarch64-sm121", "linux/arm64", "121", "aarch64"},
};

TEST(DockerFiles, BaseImagesPlatformsAndArchitectures) {
  for (const auto& e : kDockerfiles) {
    SCOPED_TRACE(e.file);
    Dockerfile d = parse_dockerfile(e.file);
    ASSERT_TRUE(d.global_args.count("CUDA_VERSION"));
    EXPECT_EQ(d.global_args["CUDA_VERSION"].rfind("13.", 0), 0u) << "CUDA 13 base images";
    int froms = 0;
    std::set<std::string> stages;
    std::map<std::string, std::string> stage_args;
    for (const auto& i : d.instructions) {
      if (i.keyword == "FROM") {
        ++froms;
        stage_args.clear();
        EXPECT_NE(i.args.find("--platform=" + e.platform + " "), std::string::npos) << "line " << i.line;
        EXPECT_NE(i.args.find("nvidia/cuda:${CUDA_VERSION}-"), std::string::npos) << "line " << i.line;
        for (const auto& ref : brace_refs(i.args)) EXPECT_TRUE(d.global_args.count(ref)) << ref;
        if (auto as = i.args.find(" AS "); as != std::string::npos) stages.insert(i.args.substr(as + 4));
        continue;
      }
      if (froms == 0) continue;
      if (i.keyword == "ARG") {
        auto eq = i.args.find('=');
        stage_args[i.args.substr(0, eq)] = eq == std::string::npos ? "" : i.args.substr(eq + 1);
      }
      // Inside a stage only its own ARGs (and ENV) expand.
      for (const auto& ref : brace_refs(i.args))
        EXPECT_TRUE(stage_args.count(ref)) << ref << " at line " << i.line;
      if (i.keyword == "COPY") {
        std::istringstream words(i.args);
        std::vector<std::string> w;
        for (std::string x; words >> x;) w.push_back(x);
        if (w.front().starts_with("--from=")) {
          EXPECT_TRUE(stages.count(w.front().substr(7))) << "unknown stage at line " << i.line;
          continue;
        }
        for (size_t k = 0; k + 1 < w.size(); ++k)
          EXPECT_TRUE(fs::exists(w[k])) << w[k] << " (line " << i.line << ")";
      }
      if (i.keyword == "ARG" && i.args.starts_with("CUDA_ARCHS=")) {
        EXPECT_EQ(i.args, "CUDA_ARCHS=" + e.cuda_archs);
      }
    }
    EXPECT_EQ(froms, 2) << "a build stage and a runtime stage";
    std::string text = read_file(e.file);
    EXPECT_NE(text.find("ENV CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos);
    EXPECT_NE(text.find("ENTRYPOINT [\"moeserve\"]"), std::string::npos);
    EXPECT_NE(text.find("EXPOSE 30000"), std::string::npos);
  }
}

// The CMake options the image build passes exist in the project.
TEST(DockerFiles, CmakeOptionsExist) {
  std::string cmake = read_file("CMakeLists.txt");
  for (const auto& e : kDockerfiles) {
    std::string text = read_file(e.file);
    static const std::regex opt(R"(-D(MOESERVE_[A-Z_]+)=)");
    int n = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), opt); it != std::sregex_iterator();
         ++it, ++n)
      EXPECT_NE(cmake.find(std::string((*it)[1])), std::string::npos) << (*it)[1] << " in " << e.file;
    EXPECT_GE(n, 4);
  }
}

// The two files are the same recipe: only platform, CUDA architecture and comments differ.
TEST(DockerFiles, TwinsDifferOnlyInPlatformAndArchitecture) {
  auto normalized = [](const Expect& e) {
    std::string out;
    for (auto i : parse_dockerfile(e.file).instructions) {
      std::string s = i.keyword + " " + i.args;
      for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
               {e.platform, "PLATFORM"}, {"CUDA_ARCHS=" + e.cuda_archs, "CUDA_ARCHS=ARCH"}})
        for (size_t at; (at = s.find(from)) != std::string::npos;) s.replace(at, from.size(), to);
      out += s + "\n";
    }
    return out;
  };
  EXPECT_EQ(normalized(kDockerfiles[0]), normalized(kDockerfiles[1]));
}

// plan's default images are the ones these files build, for the GPUs plan puts them on.
TEST(DockerFiles, MatchPlanDefaultImages) {
  ClusterSpec c = ClusterSpec::parse(parse_structured_text(R"(
nodes: [{name: a, gpu: gb10}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, nodes: [a]}]
)",
                                                           "t.yaml"),
                                     "t.yaml", ".");
  for (const auto& e : kDockerfiles) {
    const ImageSpec* img = c.image_for(e.arch);
    ASSERT_NE(img, nullptr) << e.arch;
    EXPECT_NE(read_file(e.file).find("-t " + img->image + " ."), std::string::npos) << img->image;
    ASSERT_EQ(img->cuda_archs.size(), 1u);
    EXPECT_EQ(parse_cuda_arch(img->cuda_archs[0]).capability, parse_cuda_arch(e.cuda_archs).capability);
  }
}

// ${VAR:-default} -> default, ${VAR:?message} -> "REQUIRED", as compose substitutes them with nothing set.
std::string substitute_defaults(std::string s) {
  static const std::regex def(R"(\$\{[A-Z_]+:-([^}]*)\})"), req(R"(\$\{[A-Z_]+:\?[^}]*\})");
  s = std::regex_replace(s, def, "$1");
  return std::regex_replace(s, req, "REQUIRED");
}

TEST(DockerFiles, ComposeFilesReferenceWhatExists) {
  for (const char* file : {"deploy/docker/compose.node.yaml", "deploy/docker/compose.local-cluster.yaml"}) {
    SCOPED_TRACE(file);
    auto doc = parse_structured_text(substitute_defaults(read_file(file)), file);
    ASSERT_TRUE(doc["services"].is_object());
    for (const auto& [name, svc] : doc["services"].items()) {
      SCOPED_TRACE(name);
      if (svc.contains("build")) {
        fs::path context = fs::path(file).parent_path() / svc["build"]["context"].get<std::string>();
        std::string dockerfile = (context / svc["build"]["dockerfile"].get<std::string>()).string();
        ASSERT_TRUE(fs::exists(dockerfile)) << dockerfile;
        Dockerfile d = parse_dockerfile(dockerfile);
        if (svc["build"].contains("args")) {
          for (const auto& [arg, value] : svc["build"]["args"].items())
            EXPECT_TRUE(d.global_args.count(arg))
                << "build arg " << arg << " is not an ARG of " << dockerfile;
        }
      }
      ASSERT_TRUE(svc["command"].is_array());
      std::string sub = svc["command"][0];
      EXPECT_TRUE(sub == "serve" || sub == "route") << sub;
      if (sub == "route") {
        for (size_t i = 0; i + 1 < svc["command"].size(); ++i) {
          if (svc["command"][i] != "--backend") continue;
          std::string url = svc["command"][i + 1];
          std::string host = url.substr(7, url.rfind(':') - 7);
          EXPECT_TRUE(doc["services"].contains(host)) << url;
        }
      }
    }
  }
  auto node =
      parse_structured_text(substitute_defaults(read_file("deploy/docker/compose.node.yaml")), "node");
  auto& svc = node["services"]["moeserve"];
  EXPECT_EQ(svc["ipc"], "host");
  EXPECT_EQ(svc["shm_size"], "64g");
  EXPECT_EQ(svc["ulimits"]["memlock"], -1);
  EXPECT_EQ(svc["environment"]["CUDA_DEVICE_MAX_CONNECTIONS"], "1");
  EXPECT_EQ(svc["deploy"]["resources"]["reservations"]["devices"][0]["driver"], "nvidia");
}

}  // namespace
}  // namespace moeserve::deploy
