// Every `moeserve <command> --flag` that the deployment files, the operations guide and plan's output write
// must be a flag the built binary accepts: the accepted flags come from the binary's own --help (CLI11's
// option list), so a renamed or never-existing flag (`serve --mem-fraction-static` in an old
// compose.node.yaml) fails here instead of at a node's first start.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "deploy/cluster_spec.h"
#include "deploy/plan.h"
#include "deploy/structured_file.h"
#include "test_util.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_command;

// What `moeserve <path> --help` lists: its options and its subcommands.
struct HelpPage {
  std::set<std::string> flags;
  std::set<std::string> subcommands;
};

HelpPage parse_help(const std::string& text) {
  HelpPage page;
  enum { None, Options, Subcommands } section = None;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    // Headers: "Positionals:", "Options:", "Subcommands:", and option groups ("Accepted for ...:").
    if (!line.empty() && line[0] != ' ' && line.back() == ':') {
      section = line == "Subcommands:" ? Subcommands : line == "Positionals:" ? None : Options;
    }
    // Entries start two spaces in: "  -h,--help   ...", "  --port UINT=30000   ...", "  serve   ...".
    if (line.size() < 3 || line.compare(0, 2, "  ") != 0 || line[2] == ' ') continue;
    std::string first = line.substr(2, line.find(' ', 2) - 2);
    if (section == Subcommands) page.subcommands.insert(first);
    if (section != Options) continue;
    std::istringstream names(first);
    for (std::string name; std::getline(names, name, ',');)
      if (name.starts_with("-")) page.flags.insert(name);
  }
  return page;
}

const HelpPage& help_of(const std::vector<std::string>& path) {
  static std::map<std::vector<std::string>, HelpPage> cache;
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  std::string cmd = MOESERVE_BINARY;
  for (const auto& p : path) cmd += " " + p;
  auto r = run_command(cmd + " --help");
  EXPECT_EQ(r.status, 0) << cmd << " --help\n" << r.output;
  return cache[path] = parse_help(r.output);
}

// One moeserve command line found in a file: the words after the binary (or image) name.
struct Use {
  std::string where;
  std::vector<std::string> words;
};

// The flags of a use that its (sub)command does not accept, as "serve --x (where)".
std::vector<std::string> unknown_flags(const Use& use) {
  std::vector<std::string> path;
  size_t i = 0;
  while (i < use.words.size() && help_of(path).subcommands.count(use.words[i]))
    path.push_back(use.words[i++]);
  std::vector<std::string> out;
  if (path.empty()) return out;
  const auto& accepted = help_of(path).flags;
  // Markdown synopses wrap flags in [ ] and ( | ): the flag is the leading --name of the word.
  static const std::regex flag(R"(^[\[(]*(--[A-Za-z0-9][A-Za-z0-9-]*))");
  for (; i < use.words.size(); ++i) {
    std::smatch m;
    if (!std::regex_search(use.words[i], m, flag)) continue;
    if (!accepted.count(m[1]))
      out.push_back(fmt::format("{} {} ({})", fmt::join(path, " "), std::string(m[1]), use.where));
  }
  return out;
}

bool launches_moeserve(const std::string& w) {
  return w == "moeserve" || w.ends_with("/moeserve") || w.starts_with("moeserve:");  // binary, path, image
}

// moeserve command lines in shell scripts, systemd units and markdown: continuation lines joined, each
// backtick span and each line apart, cut at comments and at ; && | between commands.
std::vector<Use> uses_in_text(const std::string& text, const std::string& where) {
  std::string joined = std::regex_replace(text, std::regex("\\\\\n"), " ");
  std::vector<Use> out;
  std::istringstream lines(joined);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    std::istringstream spans(line);
    for (std::string span; std::getline(spans, span, '`');) {
      std::istringstream in(span);
      std::vector<std::string> words;
      for (std::string w; in >> w;) {
        if (w.starts_with("#") || w == ";" || w == "&&" || w == "|") break;
        if (w.starts_with("ExecStart=")) w = w.substr(10);
        if (w.size() >= 2 && (w.front() == '"' || w.front() == '\'') && w.back() == w.front())
          w = w.substr(1, w.size() - 2);
        words.push_back(w);
      }
      for (size_t i = 0; i + 1 < words.size(); ++i)
        if (launches_moeserve(words[i]) && help_of({}).subcommands.count(words[i + 1]))
          out.push_back({fmt::format("{}:{}", where, number), {words.begin() + long(i) + 1, words.end()}});
    }
  }
  return out;
}

// ${VAR:-default} -> default, ${VAR:?message} -> "REQUIRED", as compose substitutes them with nothing set.
std::string substitute_defaults(std::string s) {
  static const std::regex def(R"(\$\{[A-Z_]+:-([^}]*)\})"), req(R"(\$\{[A-Z_]+:\?[^}]*\})");
  s = std::regex_replace(s, def, "$1");
  return std::regex_replace(s, req, "REQUIRED");
}

std::vector<Use> uses_in_compose(const std::string& file) {
  auto doc = parse_structured_text(substitute_defaults(read_file(file)), file);
  std::vector<Use> out;
  for (const auto& [name, svc] : doc["services"].items()) {
    Use use{file + " service " + name, {}};
    for (const auto& w : svc["command"]) use.words.push_back(w.get<std::string>());
    out.push_back(use);
  }
  return out;
}

// CMD ["serve", ...] after ENTRYPOINT ["moeserve"].
std::vector<Use> uses_in_dockerfile(const std::string& file) {
  std::vector<Use> out;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("CMD [")) {
      Use use{file + " CMD", {}};
      for (const auto& w : nlohmann::json::parse(line.substr(4))) use.words.push_back(w.get<std::string>());
      out.push_back(use);
    }
  return out;
}

std::vector<std::string> all_unknown(const std::vector<Use>& uses) {
  std::vector<std::string> out;
  for (const auto& u : uses)
    for (auto& f : unknown_flags(u)) out.push_back(f);
  return out;
}

TEST(CommandFlags, HelpListsOptionsAndSubcommands) {
  const HelpPage& top = help_of({});
  for (const char* sub : {"serve", "route", "plan", "doctor", "cluster"})
    EXPECT_TRUE(top.subcommands.count(sub));
  const HelpPage& serve = help_of({"serve"});
  for (const char* flag : {"--model", "--device", "--port", "--tp", "--cache-memory-gb", "--help", "-h"})
    EXPECT_TRUE(serve.flags.count(flag)) << flag;
  EXPECT_TRUE(help_of({"cluster"}).subcommands.count("up"));
  EXPECT_TRUE(help_of({"cluster", "up"}).flags.count("--local"));
}

// The checker itself: a misspelt flag, a flag of another command and a flag after the wrong subcommand level
// are all caught, in every kind of file it reads.
TEST(CommandFlags, CatchesFlagsTheBinaryRejects) {
  auto bad = all_unknown(uses_in_text(
      "exec /usr/local/bin/moeserve serve --model /m \\\n  --mem-fraction-statik 0.85\n"
      "ExecStart=/opt/moeserve route --config /etc/r.yaml --model x\n"
      "run `moeserve cluster up --local 3 --tp 2` or `moeserve doctor [--jsonn]`\n"
      "docker run --gpus all --name moeserve-m moeserve:aarch64-sm121 serve --device cuda --nope 1\n",
      "t"));
  std::vector<std::string> want = {"serve --mem-fraction-statik (t:1)", "route --model (t:2)",
                                   "cluster up --tp (t:3)", "doctor --jsonn (t:3)", "serve --nope (t:4)"};
  EXPECT_EQ(bad, want);
  // --gpus and --name belong to docker, not to moeserve; flags before the subcommand are not checked here.
  EXPECT_TRUE(all_unknown(uses_in_text("docker run --gpus all moeserve:x serve --model demo", "t")).empty());
}

TEST(CommandFlags, DeployFilesUseFlagsTheBinaryAccepts) {
  std::vector<Use> uses;
  for (const auto& e : fs::directory_iterator("deploy/docker")) {
    std::string file = e.path().string();
    std::vector<Use> found = e.path().filename().string().starts_with("compose.") ? uses_in_compose(file)
                             : e.path().filename().string().starts_with("Dockerfile.")
                                 ? uses_in_dockerfile(file)
                                 : std::vector<Use>{};
    auto in_comments = uses_in_text(read_file(file), file);  // example lines in comments
    found.insert(found.end(), in_comments.begin(), in_comments.end());
    EXPECT_FALSE(found.empty()) << file << ": no moeserve command found";
    uses.insert(uses.end(), found.begin(), found.end());
  }
  for (const char* file : {"deploy/cluster-spark9.yaml", "deploy/cluster-mixed-4xtp2-1.yaml",
                           "docs/operations.md", "docs/compat.md"}) {
    auto found = uses_in_text(read_file(file), file);
    uses.insert(uses.end(), found.begin(), found.end());
  }
  size_t flags = 0;
  for (const auto& u : uses)
    for (const auto& w : u.words) flags += w.starts_with("--");
  EXPECT_GE(flags, 40u) << "the files name far more flags than this: the reader lost them";
  auto bad = all_unknown(uses);
  EXPECT_TRUE(bad.empty()) << "flags the binary rejects:\n  " << fmt::format("{}", fmt::join(bad, "\n  "));
}

// Every file plan writes for both example clusters: serve.sh, the systemd units, docker-run.sh, route.sh and
// the commands in plan.json.
TEST(CommandFlags, PlanOutputUsesFlagsTheBinaryAccepts) {
  for (const char* example : {"deploy/cluster-spark9.yaml", "deploy/cluster-mixed-4xtp2-1.yaml"}) {
    Plan p = make_plan(ClusterSpec::load(example));
    std::vector<Use> uses;
    for (const auto& f : p.files) {
      auto found = uses_in_text(f.content, fmt::format("{}: {}", example, f.path));
      uses.insert(uses.end(), found.begin(), found.end());
    }
    size_t serve = 0;  // launch lines, not mentions of `moeserve serve` in comments
    for (const auto& u : uses)
      serve += u.words.front() == "serve" && std::count(u.words.begin(), u.words.end(), "--model");
    EXPECT_EQ(serve, 4 * 9u) << example
                             << ": serve.sh, moeserve.service, docker-run.sh and plan.json per node";
    auto bad = all_unknown(uses);
    EXPECT_TRUE(bad.empty()) << "flags the binary rejects:\n  " << fmt::format("{}", fmt::join(bad, "\n  "));
  }
}

// The demo model reads the Qwen3 tokenizer from .cache/tokenizer-qwen3, relative to the working directory,
// which the images do not carry: every compose service serving `--model demo` must get it mounted and point
// --tokenizer at it.
TEST(CommandFlags, ComposeDemoServersGetTheTokenizer) {
  const std::string file = "deploy/docker/compose.local-cluster.yaml";
  auto doc = parse_structured_text(substitute_defaults(read_file(file)), file);
  int demo = 0;
  for (const auto& [name, svc] : doc["services"].items()) {
    std::vector<std::string> cmd = svc["command"];
    auto model = std::find(cmd.begin(), cmd.end(), "--model");
    if (model == cmd.end() || model + 1 == cmd.end() || model[1] != "demo") continue;
    ++demo;
    SCOPED_TRACE(name);
    auto tok = std::find(cmd.begin(), cmd.end(), "--tokenizer");
    ASSERT_TRUE(tok != cmd.end() && tok + 1 != cmd.end()) << "no --tokenizer";
    bool mounted = false;
    for (const auto& v : svc["volumes"]) {
      if (!v.is_object() || v["target"] != tok[1]) continue;
      mounted = true;
      EXPECT_EQ(v["type"], "bind");
      fs::path source = fs::path(file).parent_path() / v["source"].get<std::string>();
      EXPECT_TRUE(fs::exists(source / "tokenizer.json"))
          << source << " (scripts/fetch-test-data.sh fetches it)";
      // A missing source must stop compose, not become an empty directory the server then rejects.
      EXPECT_FALSE(v.contains("bind") && v["bind"].value("create_host_path", false));
    }
    EXPECT_TRUE(mounted) << tok[1] << " is not a mounted volume";
  }
  EXPECT_EQ(demo, 3);
}

// A node that reserves NVIDIA GPUs must say so to serve (its default, auto, would fall back to the CPU in a
// container that does not see them).
TEST(CommandFlags, ComposeGpuNodesServeOnCuda) {
  const std::string file = "deploy/docker/compose.node.yaml";
  auto doc = parse_structured_text(substitute_defaults(read_file(file)), file);
  int gpu_services = 0;
  for (const auto& [name, svc] : doc["services"].items()) {
    if (!svc.contains("deploy")) continue;
    bool gpu = false;
    for (const auto& d : svc["deploy"]["resources"]["reservations"]["devices"])
      gpu = gpu || d["driver"] == "nvidia";
    if (!gpu) continue;
    ++gpu_services;
    std::vector<std::string> cmd = svc["command"];
    auto device = std::find(cmd.begin(), cmd.end(), "--device");
    ASSERT_TRUE(device != cmd.end() && device + 1 != cmd.end()) << name << " serves on the CPU";
    EXPECT_EQ(device[1], "cuda") << name;
  }
  EXPECT_EQ(gpu_services, 1);
}

}  // namespace
}  // namespace moeserve::deploy
