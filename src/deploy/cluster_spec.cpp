#include "deploy/cluster_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>

#include "common/error.h"
#include "deploy/gpus.h"
#include "deploy/structured_file.h"
#include "deploy/units.h"

namespace moeserve::deploy {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A view of one mapping in the file that knows its path ("models[1].nodes") for error messages and rejects
// keys nobody asked for, so a typo ("max_fail") is an error instead of a silently ignored setting.
class Section {
 public:
  Section(const json& j, std::string path, std::string source)
      : j_(j), path_(std::move(path)), src_(std::move(source)) {
    check(j_.is_object() || j_.is_null(), "{}: {} must be a mapping, not {}", src_, where(), j_.type_name());
  }
  ~Section() = default;

  std::string where(const std::string& key = "") const {
    if (key.empty()) return path_.empty() ? "the top level" : path_;
    return path_.empty() ? key : path_ + "." + key;
  }
  std::string error_prefix(const std::string& key) const { return fmt::format("{}: {}", src_, where(key)); }

  const json* find(const std::string& key) {
    seen_.insert(key);
    if (!j_.is_object()) return nullptr;
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) { return find(key) != nullptr; }

  std::string str(const std::string& key, std::string fallback = "", bool required = false) {
    const json* v = find(key);
    if (!v) {
      check(!required, "{} is required", error_prefix(key));
      return fallback;
    }
    if (v->is_number_integer())
      return std::to_string(v->get<int64_t>());  // "port: 8000" read as text is fine
    check(v->is_string(), "{} must be text, not {}", error_prefix(key), v->type_name());
    return v->get<std::string>();
  }
  int64_t integer(const std::string& key, int64_t fallback, int64_t min = INT64_MIN,
                  int64_t max = INT64_MAX) {
    const json* v = find(key);
    if (!v) return fallback;
    check(v->is_number_integer(), "{} must be a whole number, not {}", error_prefix(key), v->dump());
    int64_t x = v->get<int64_t>();
    check(x >= min && x <= max, "{} = {} is out of range [{}, {}]", error_prefix(key), x, min, max);
    return x;
  }
  double number(const std::string& key, double fallback, double min, double max) {
    const json* v = find(key);
    if (!v) return fallback;
    check(v->is_number(), "{} must be a number, not {}", error_prefix(key), v->dump());
    double x = v->get<double>();
    check(x >= min && x <= max, "{} = {} is out of range [{}, {}]", error_prefix(key), x, min, max);
    return x;
  }
  bool boolean(const std::string& key, bool fallback) {
    const json* v = find(key);
    if (!v) return fallback;
    check(v->is_boolean(), "{} must be true or false", error_prefix(key));
    return v->get<bool>();
  }
  double seconds(const std::string& key, double fallback) {
    const json* v = find(key);
    if (!v) return fallback;
    if (v->is_number()) return v->get<double>();
    check(v->is_string(), "{} must be a duration such as 30s", error_prefix(key));
    return parse_seconds(v->get<std::string>(), error_prefix(key));
  }
  double bytes(const std::string& key, double fallback) {
    const json* v = find(key);
    if (!v) return fallback;
    if (v->is_number()) return v->get<double>();
    check(v->is_string(), "{} must be a size such as 128GB", error_prefix(key));
    return double(parse_bytes(v->get<std::string>(), error_prefix(key)));
  }
  std::vector<std::string> strings(const std::string& key) {
    const json* v = find(key);
    if (!v) return {};
    check(v->is_array(), "{} must be a list", error_prefix(key));
    std::vector<std::string> out;
    for (const auto& e : *v) {
      check(e.is_string() || e.is_number(), "{} must hold text entries", error_prefix(key));
      out.push_back(e.is_string() ? e.get<std::string>() : e.dump());
    }
    return out;
  }
  Section section(const std::string& key) {
    const json* v = find(key);
    static const json null_json;
    return Section(v ? *v : null_json, where(key), src_);
  }

  // Call after reading every field.
  void finish() const {
    if (!j_.is_object()) return;
    for (const auto& [key, value] : j_.items()) {
      if (seen_.count(key)) continue;
      std::vector<std::string> known(seen_.begin(), seen_.end());
      fail("{}: unknown key '{}' in {} (known: {})", src_, key, where(), fmt::join(known, ", "));
    }
  }

 private:
  const json& j_;
  std::string path_;
  std::string src_;
  std::set<std::string> seen_;
};

NodeSpec parse_node(Section& s, const NodeSpec& defaults) {
  NodeSpec n;
  n.name = s.str("name", "", true);
  n.host = s.str("host", n.name);
  n.arch = s.str("arch", defaults.arch);
  n.gpu = s.str("gpu", defaults.gpu);
  n.gpus = int(s.integer("gpus", defaults.gpus, 1, 64));
  n.memory = s.bytes("memory", defaults.memory);
  n.nic = s.str("nic", defaults.nic);
  s.finish();

  check(!n.gpu.empty(), "{}: gpu is required (one of {})", s.error_prefix("gpu"), known_gpu_keys());
  const GpuKind* kind = find_gpu(n.gpu);
  check(kind != nullptr, "{}: unknown GPU '{}' (known: {})", s.error_prefix("gpu"), n.gpu, known_gpu_keys());
  n.gpu = kind->key;
  if (n.arch.empty()) n.arch = kind->host_arch;
  check(!normalize_arch(n.arch).empty(), "{}: unknown architecture '{}' (use aarch64 or x86_64)",
        s.error_prefix("arch"), n.arch);
  n.arch = normalize_arch(n.arch);
  if (n.memory <= 0) n.memory = double(kind->memory_bytes);
  check(n.memory > 0, "{}: memory is required for GPU kind '{}'", s.error_prefix("memory"), n.gpu);
  return n;
}

}  // namespace

const NodeSpec* ClusterSpec::node(const std::string& n) const {
  for (const auto& x : nodes)
    if (x.name == n) return &x;
  return nullptr;
}

const ImageSpec* ClusterSpec::image_for(const std::string& arch) const {
  for (const auto& i : images)
    if (i.arch == arch) return &i;
  return nullptr;
}

ClusterSpec ClusterSpec::parse(const json& root, const std::string& source, const std::string& base_dir) {
  ClusterSpec c;
  c.source = source;
  Section top(root, "", source);
  c.name = top.str("cluster", "moeserve");

  // Node defaults, then nodes.
  NodeSpec defaults;
  {
    Section d = top.section("defaults");
    defaults.arch = d.str("arch");
    defaults.gpu = d.str("gpu");
    defaults.gpus = int(d.integer("gpus", 1, 1, 64));
    defaults.memory = d.bytes("memory", 0);
    defaults.nic = d.str("nic");
    d.finish();
  }
  const json* nodes = top.find("nodes");
  check(nodes && nodes->is_array() && !nodes->empty(), "{}: 'nodes' must be a non-empty list", source);
  for (size_t i = 0; i < nodes->size(); ++i) {
    Section s((*nodes)[i], fmt::format("nodes[{}]", i), source);
    NodeSpec n = parse_node(s, defaults);
    check(c.node(n.name) == nullptr, "{}: node name '{}' appears twice", source, n.name);
    c.nodes.push_back(std::move(n));
  }

  // Images, per architecture.
  if (const json* images = top.find("images")) {
    check(images->is_object(), "{}: 'images' must map an architecture to an image", source);
    for (const auto& [arch, value] : images->items()) {
      Section s(value, "images." + arch, source);
      ImageSpec img;
      img.arch = normalize_arch(arch);
      check(!img.arch.empty(), "{}: images.{}: unknown architecture (use aarch64 or x86_64)", source, arch);
      img.image = s.str("image", "", true);
      img.cuda_archs = s.strings("cuda_archs");
      for (const auto& a : img.cuda_archs) parse_cuda_arch(a);  // validates
      s.finish();
      c.images.push_back(std::move(img));
    }
  } else {
    // The images deploy/docker builds.
    c.images = {{"aarch64", "moeserve:aarch64-sm121", {"sm_121"}},
                {"x86_64", "moeserve:x86_64-sm90", {"sm_90a"}}};
  }

  // Router and monitoring come before models: a model's router port defaults from router.port.
  {
    Section r = top.section("router");
    c.router.host = r.str("host", c.nodes.front().host);
    c.router.listen = r.str("listen");
    c.router.port = int(r.integer("port", 8000, 1, 65535));
    c.router.policy = r.str("policy", "least_conn");
    static const std::set<std::string> policies = {"least_conn", "round_robin", "power_of_two", "cache_aware",
                                                   "random"};
    check(policies.count(c.router.policy), "{}: unknown policy '{}' (use {})", r.error_prefix("policy"),
          c.router.policy, fmt::join(policies, ", "));
    c.router.max_fails = int(r.integer("max_fails", 3, 0, 1000));
    c.router.fail_timeout = r.seconds("fail_timeout", 30);
    c.router.keepalive = int(r.integer("keepalive", 32, 0, 100000));
    c.router.keepalive_timeout = r.seconds("keepalive_timeout", 300);
    c.router.read_timeout = r.seconds("read_timeout", 300);
    c.router.send_timeout = r.seconds("send_timeout", 300);
    c.router.health_interval = r.seconds("health_interval", 10);
    r.finish();
  }
  {
    Section m = top.section("monitoring");
    c.monitoring.prometheus_host = m.str("prometheus_host", c.router.host);
    c.monitoring.prometheus_port = int(m.integer("prometheus_port", 9090, 1, 65535));
    c.monitoring.scrape_interval = m.seconds("scrape_interval", 15);
    c.monitoring.grafana_port = int(m.integer("grafana_port", 3000, 1, 65535));
    Section a = m.section("alerts");
    c.monitoring.alerts.error_rate = a.number("error_rate", 0.05, 0, 1);
    c.monitoring.alerts.memory_pressure = a.number("memory_pressure", 0.90, 0, 1);
    c.monitoring.alerts.kv_usage = a.number("kv_usage", 0.95, 0, 1);
    c.monitoring.alerts.ttft_p99_seconds = a.seconds("ttft_p99", 10);
    c.monitoring.alerts.node_down_for = a.seconds("node_down_for", 60);
    a.finish();
    m.finish();
  }
  {
    Section s = top.section("install");
    c.install.binary = s.str("binary", c.install.binary);
    c.install.user = s.str("user", c.install.user);
    c.install.config_dir = s.str("config_dir", c.install.config_dir);
    c.install.shm_size = s.str("shm_size", c.install.shm_size);
    parse_bytes(c.install.shm_size, s.error_prefix("shm_size"));
    c.install.shutdown_timeout = s.seconds("shutdown_timeout", c.install.shutdown_timeout);
    s.finish();
  }

  const json* models = top.find("models");
  check(models && models->is_array() && !models->empty(), "{}: 'models' must be a non-empty list", source);
  for (size_t i = 0; i < models->size(); ++i) {
    Section s((*models)[i], fmt::format("models[{}]", i), source);
    ModelSpec m;
    m.name = s.str("name", "", true);
    m.path = s.str("path", "", true);
    m.config = s.str("config");
    m.preset = s.str("preset");
    m.precision.weights = s.str("dtype", "bf16");
    // auto is serve's choice on a GPU (bf16); plan passes what it sized for to serve explicitly.
    m.precision.kv = kv_precision(s.str("kv_cache_dtype", "auto"), true, s.where());
    validate_precision(m.precision, s.where());
    m.max_model_len = s.integer("max_model_len", 32768, 1, int64_t(1) << 30);
    m.max_running_requests = int(s.integer("max_running_requests", 16, 1, 1 << 20));
    m.mem_fraction = s.number("mem_fraction", 0.85, 0.05, 1.0);
    m.prefill_chunk = int(s.integer("prefill_chunk", 0, 16, 1 << 20));
    m.port = int(s.integer("port", 30000, 1, 65535));
    m.dist_port = int(s.integer("dist_port", 29500, 1, 65535));
    m.experimental = s.boolean("experimental", false);
    m.router_port = int(s.integer("router_port", c.router.port + int64_t(i), 1, 65535));
    m.extra_args = s.strings("extra_args");

    const json* placement = s.find("nodes");
    check(placement && placement->is_array() && !placement->empty(),
          "{}: models[{}].nodes must list the nodes (a name per replica, or a list of names per TP group)",
          source, i);
    for (const auto& entry : *placement) {
      std::vector<std::string> group;
      if (entry.is_string()) {
        group.push_back(entry.get<std::string>());
      } else {
        check(entry.is_array() && !entry.empty(),
              "{}: models[{}].nodes entries must be names or lists of names", source, i);
        for (const auto& n : entry) {
          check(n.is_string(), "{}: models[{}].nodes entries must be names or lists of names", source, i);
          group.push_back(n.get<std::string>());
        }
      }
      for (const auto& n : group)
        check(c.node(n) != nullptr, "{}: models[{}] ({}) places a replica on '{}', which is not in 'nodes'",
              source, i, m.name, n);
      m.replicas.push_back(std::move(group));
    }
    int gpus = 0;
    for (const auto& n : m.replicas.front()) gpus += c.node(n)->gpus;
    m.tp = int(s.integer("tp", gpus, 1, 1024));
    for (size_t r = 0; r < m.replicas.size(); ++r) {
      int g = 0;
      for (const auto& n : m.replicas[r]) g += c.node(n)->gpus;
      check(g == m.tp, "{}: models[{}] ({}) replica {} has {} GPUs but tp is {}; every replica needs tp GPUs",
            source, i, m.name, r + 1, g, m.tp);
    }

    // The architecture: an explicit config.json, then the checkpoint's own (when this machine has it), then a
    // preset.
    std::string config_path = m.config;
    if (!config_path.empty() && fs::path(config_path).is_relative())
      config_path = (fs::path(base_dir) / config_path).string();
    if (config_path.empty() && fs::exists(fs::path(m.path) / "config.json"))
      config_path = (fs::path(m.path) / "config.json").string();
    if (!config_path.empty()) {
      m.resolved_config = ModelConfig::from_file(config_path);
      m.config_source = config_path;
      if (m.resolved_config.fp8) m.precision.weights = "fp8";
    } else {
      check(!m.preset.empty(),
            "{}: models[{}] ({}): no config.json at {} on this machine; set 'config' to a copy of it or "
            "'preset' to "
            "one of {}",
            source, i, m.name, m.path, known_model_presets());
      auto preset = model_preset(m.preset);
      check(preset.has_value(), "{}: models[{}].preset '{}' is unknown (known: {})", source, i, m.preset,
            known_model_presets());
      m.resolved_config = *preset;
      m.config_source = "preset " + m.preset;
    }
    s.finish();
    for (const auto& other : c.models)
      check(other.name != m.name, "{}: model name '{}' appears twice", source, m.name);
    c.models.push_back(std::move(m));
  }
  top.finish();
  return c;
}

ClusterSpec ClusterSpec::load(const std::string& path) {
  return parse(load_structured_file(path), path, fs::path(path).parent_path().string());
}

}  // namespace moeserve::deploy
