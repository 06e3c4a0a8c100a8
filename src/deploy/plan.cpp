#include "deploy/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/error.h"
#include "deploy/decode_bound.h"
#include "deploy/gpus.h"
#include "deploy/units.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string replica_label(const ModelSpec& m, int replica) {
  return m.replicas.size() > 1 ? fmt::format("{} replica {}", m.name, replica + 1) : m.name;
}

// The image check: the node's CPU must run the image's binaries and its GPU the image's kernels.
void check_image(const ClusterSpec& c, const NodeSpec& n, std::vector<std::string>& problems) {
  const ImageSpec* img = c.image_for(n.arch);
  if (!img) {
    problems.push_back(fmt::format(
        "node {} is {} but no image is given for {} (images: {}); add images.{} (deploy/docker/Dockerfile.{} "
        "builds one). An image of the wrong architecture dies at start with 'exec format error' or 'Illegal "
        "instruction'",
        n.name, n.arch, n.arch, c.images.empty() ? "none" : c.images.front().arch, n.arch,
        n.arch == "aarch64" ? "aarch64-sm121" : "x86_64-sm90"));
    return;
  }
  const GpuKind* kind = find_gpu(n.gpu);
  if (!kind || kind->compute_capability == 0 || img->cuda_archs.empty()) return;
  for (const auto& a : img->cuda_archs)
    if (cuda_arch_runs_on(parse_cuda_arch(a), kind->compute_capability)) return;
  problems.push_back(
      fmt::format("node {} has a {} ({}), but image {} carries kernels for {} only; its kernels would not "
                  "load. Build an image "
                  "with {} (deploy/docker/Dockerfile.{})",
                  n.name, kind->key, format_cuda_arch(kind->compute_capability), img->image,
                  fmt::join(img->cuda_archs, ", "), format_cuda_arch(kind->compute_capability),
                  n.arch == "aarch64" ? "aarch64-sm121" : "x86_64-sm90"));
}

std::vector<std::string> model_nodes(const ModelSpec& m) {
  std::vector<std::string> out;
  for (const auto& group : m.replicas) out.insert(out.end(), group.begin(), group.end());
  return out;
}

struct PortUse {
  std::string host;
  int port;
  std::string what;
};

void check_ports(const std::vector<PortUse>& uses, std::vector<std::string>& problems) {
  std::map<std::pair<std::string, int>, std::string> owner;
  for (const auto& u : uses) {
    auto [it, inserted] = owner.emplace(std::make_pair(u.host, u.port), u.what);
    if (!inserted && it->second != u.what)
      problems.push_back(
          fmt::format("port {} on {} is used twice: by {} and by {}; give one of them another port", u.port,
                      u.host, it->second, u.what));
  }
}

// Per model (its first replica's GPU): the decode bound at batch 1 and at max_running_requests, with
// contexts of 8K tokens (or max_model_len, if shorter), so that an operator sees what a node can give before
// measuring it (docs/operations.md, "Decode bound").
std::string decode_bounds(const std::vector<Assignment>& as) {
  std::string out;
  std::set<const ModelSpec*> seen;
  for (const auto& a : as) {
    const GpuKind* kind = find_gpu(a.node->gpu);
    if (!kind || kind->memory_bandwidth <= 0 || !seen.insert(a.model).second) continue;
    const ModelSpec& m = *a.model;
    const int64_t context = std::min<int64_t>(m.max_model_len, 8192);
    auto bound = [&](int64_t batch) {
      const DecodeStepBytes b = decode_step_bytes(m.resolved_config, m.precision, m.tp, batch, context);
      return fmt::format("batch {} {:.0f} tok/s ({} a step)", batch,
                         double(batch) / b.seconds(kind->memory_bandwidth), format_bytes(b.total()));
    };
    out += fmt::format("  {} on {} ({}/s, tp {}), contexts of {} tokens: {}; {}\n", m.name, a.node->gpu,
                       format_bytes(kind->memory_bandwidth), m.tp, context, bound(1),
                       bound(m.max_running_requests));
  }
  if (out.empty()) return out;
  return "\ndecode bound (a rank's bytes a step over its GPU's data-sheet bandwidth, uniform routing):\n" +
         out;
}

std::string summary_table(const ClusterSpec& c, const std::vector<Assignment>& as) {
  std::string out = fmt::format("{:<14} {:<16} {:<22} {:<9} {:>10} {:>10} {:>11}\n", "node", "host", "model",
                                "rank", "need", "budget", "sequences");
  for (const auto& a : as) {
    out += fmt::format("{:<14} {:<16} {:<22} {:<9} {:>10} {:>10} {:>11}\n", a.node->name, a.node->host,
                       a.model->name, fmt::format("{}/{}", a.rank, a.nnodes), format_bytes(a.fit.need),
                       format_bytes(a.fit.budget),
                       fmt::format("{}..{}", a.model->max_running_requests, a.fit.max_concurrency));
  }
  out += fmt::format("\nrouter: http://{}:{}/v1 (every model)", c.router.host, c.router.port);
  if (c.models.size() > 1) {
    out += "; nginx alternative:";
    for (const auto& m : c.models) out += fmt::format(" {} on :{}", m.name, m.router_port);
  }
  out += fmt::format("\nprometheus: {}:{}, grafana: {}:{}\n", c.monitoring.prometheus_host,
                     c.monitoring.prometheus_port, c.monitoring.prometheus_host, c.monitoring.grafana_port);
  return out + decode_bounds(as);
}

json manifest(const ClusterSpec& c, const Plan& p) {
  json nodes = json::array();
  for (const auto& a : p.assignments) {
    nodes.push_back({{"node", a.node->name},
                     {"host", a.node->host},
                     {"arch", a.node->arch},
                     {"gpu", a.node->gpu},
                     {"model", a.model->name},
                     {"replica", a.replica + 1},
                     {"rank", a.rank},
                     {"nnodes", a.nnodes},
                     {"tp", a.model->tp},
                     {"memory_need_bytes", a.fit.need},
                     {"memory_budget_bytes", a.fit.budget},
                     {"weights_bytes", a.fit.per_rank.weights},
                     {"kv_bytes", a.fit.kv_total},
                     {"state_bytes", a.fit.state_total},
                     {"workspace_bytes", a.fit.per_rank.workspace},
                     {"max_running_requests_that_fit", a.fit.max_concurrency},
                     {"command", std::string(c.install.binary) + " " + render_serve_args(c, a)}});
  }
  json models = json::array();
  for (const auto& m : c.models)
    models.push_back({{"name", m.name},
                      {"path", m.path},
                      {"config", m.config_source},
                      {"dtype", m.precision.weights},
                      {"tp", m.tp},
                      {"replicas", m.replicas},
                      {"router", fmt::format("http://{}:{}", c.router.host, c.router.port)},
                      {"nginx", fmt::format("http://{}:{}", c.router.host, m.router_port)}});
  return {{"cluster", c.name},
          {"source", c.source},
          {"nodes", nodes},
          {"models", models},
          {"warnings", p.warnings}};
}

}  // namespace

Plan make_plan(const ClusterSpec& c) {
  Plan plan;
  std::vector<std::string> problems;
  std::map<std::string, std::string> node_owner;
  std::vector<PortUse> ports;
  // A refusal that repeats on identical replicas is reported once, naming them all.
  std::map<std::string, std::vector<std::string>> fit_problems;
  std::vector<std::string> fit_order;

  for (const auto& m : c.models) {
    const ModelConfig& cfg = m.resolved_config;
    if (m.max_model_len > cfg.max_position_embeddings)
      problems.push_back(
          fmt::format("{}: max_model_len {} exceeds the model's max_position_embeddings {}; use at most {} "
                      "(longer prompts "
                      "would be cut, not served)",
                      m.name, m.max_model_len, cfg.max_position_embeddings, cfg.max_position_embeddings));
    if (m.port == m.dist_port)
      problems.push_back(fmt::format(
          "{}: port and dist_port are both {}; give the TP rendezvous another port", m.name, m.port));

    for (size_t r = 0; r < m.replicas.size(); ++r) {
      const auto& group = m.replicas[r];
      const NodeSpec* leader = c.node(group.front());
      double memory = leader->memory;
      bool all_spark = true;
      for (size_t rank = 0; rank < group.size(); ++rank) {
        const NodeSpec* n = c.node(group[rank]);
        std::string who = fmt::format("{} (rank {})", replica_label(m, int(r)), rank);
        if (auto [it, inserted] = node_owner.emplace(n->name, who); !inserted)
          problems.push_back(
              fmt::format("node {} is given to both {} and {}; a node runs one server (its GPU "
                          "memory is not shared between servers); give each its own nodes",
                          n->name, it->second, who));
        const GpuKind* kind = find_gpu(n->gpu);
        if (!kind->host_arch.empty() && kind->host_arch != n->arch)
          problems.push_back(fmt::format("node {}: a {} sits in {} hosts, not {}; fix arch or gpu", n->name,
                                         n->gpu, kind->host_arch, n->arch));
        if (m.precision.weights == "fp8" && kind->compute_capability > 0 && !kind->fp8)
          problems.push_back(
              fmt::format("{}: node {} has a {} ({}), which has no FP8 tensor cores; serve a BF16 "
                          "checkpoint there or use sm_89+ GPUs",
                          m.name, n->name, n->gpu, format_cuda_arch(kind->compute_capability)));
        if (n->gpu != leader->gpu || n->arch != leader->arch)
          problems.push_back(fmt::format(
              "{}: a TP group mixes {} ({} {}) with {} ({} {}); the ranks of one replica "
              "must be the same kind of machine",
              replica_label(m, int(r)), leader->name, leader->gpu, leader->arch, n->name, n->gpu, n->arch));
        check_image(c, *n, problems);
        memory = std::min(memory, n->memory);
        all_spark = all_spark && n->gpu == "gb10";
        ports.push_back({n->host, m.port, fmt::format("moeserve serve on {}", n->name)});
      }
      if (group.size() > 1)
        ports.push_back(
            {leader->host, m.dist_port, fmt::format("the TP rendezvous of {}", replica_label(m, int(r)))});
      if (r == 0) {
        if (std::string limit = tp_launch_limit(m, *leader); !limit.empty())
          plan.warnings.push_back(fmt::format("{} (tp {}) will not start on {}: {}", m.name, m.tp,
                                              fmt::join(model_nodes(m), ", "), limit));
      }
      if (group.size() > 2 && all_spark) {
        std::string text = fmt::format(
            "{}: a TP group of {} DGX Spark nodes is experimental: NVIDIA supports two directly connected "
            "Sparks; "
            "more need a switch and a custom NCCL setup",
            replica_label(m, int(r)), group.size());
        if (m.experimental)
          plan.warnings.push_back(text);
        else
          problems.push_back(text +
                             ". Use pairs (tp 2 over two nodes), or set experimental: true on the model to "
                             "accept it");
      }

      FitQuery q;
      q.config = cfg;
      q.model_name = m.name;
      q.precision = m.precision;
      q.tp = m.tp;
      q.context = m.max_model_len;
      q.concurrency = m.max_running_requests;
      q.memory = memory;
      q.mem_fraction = m.mem_fraction;
      q.prefill_chunk = step_tokens(m, *leader);
      FitResult fit = check_fit(q);
      if (!fit.fits) {
        std::string key = fmt::format(
            "{} ({}, {}, tp {}) does not fit {} at mem_fraction {} ({} per GPU): needs {} for {} x {} "
            "tokens. {}",
            m.name, m.precision.weights, m.config_source, m.tp, leader->gpu, m.mem_fraction,
            format_bytes(fit.budget), fit.breakdown(), m.max_running_requests, m.max_model_len,
            fit.would_fit.empty() ? std::string("Nothing nearby fits: use GPUs with more memory")
                                  : fmt::format("Would fit: {}", fmt::join(fit.would_fit, "; or ")));
        if (!fit_problems.count(key)) fit_order.push_back(key);
        fit_problems[key].push_back(fmt::format("{}", fmt::join(group, "+")));
      }
      for (size_t rank = 0; rank < group.size(); ++rank) {
        Assignment a;
        a.node = c.node(group[rank]);
        a.model = &m;
        a.replica = int(r);
        a.rank = int(rank);
        a.nnodes = int(group.size());
        a.leader = leader;
        a.fit = fit;
        plan.assignments.push_back(a);
      }
    }
    if (m.router_port != c.router.port)
      ports.push_back({c.router.host, m.router_port, fmt::format("nginx for {}", m.name)});
  }
  ports.push_back({c.router.host, c.router.port, "the router"});
  ports.push_back({c.monitoring.prometheus_host, c.monitoring.prometheus_port, "Prometheus"});
  ports.push_back({c.monitoring.prometheus_host, c.monitoring.grafana_port, "Grafana"});
  check_ports(ports, problems);
  for (const auto& key : fit_order)
    problems.push_back(fmt::format("{} [nodes: {}]", key, fmt::join(fit_problems[key], ", ")));

  if (!problems.empty())
    fail("{}: refusing to plan ({} problem{}):\n  - {}", c.source, problems.size(),
         problems.size() == 1 ? "" : "s", fmt::join(problems, "\n  - "));

  // Render.
  for (const auto& a : plan.assignments) {
    std::string dir = "nodes/" + a.node->name + "/";
    plan.files.push_back({dir + "serve.sh", render_launch_script(c, a), true});
    plan.files.push_back({dir + "moeserve.service", render_systemd_unit(c, a), false});
    plan.files.push_back({dir + "docker-run.sh", render_docker_run(c, a), true});
  }
  plan.files.push_back({"router/router.yaml", render_router_config(c, plan.assignments), false});
  plan.files.push_back({"router/route.sh", render_router_script(c), true});
  plan.files.push_back({"router/moeserve-route.service", render_router_unit(c), false});
  plan.files.push_back({"router/nginx.conf", render_nginx_conf(c, plan.assignments), false});
  plan.files.push_back({"monitoring/prometheus.yml", render_prometheus_config(c, plan.assignments), false});
  plan.files.push_back({"monitoring/alerts.yml", render_alert_rules(c), false});
  plan.files.push_back(
      {"monitoring/grafana-dashboard.json", render_grafana_dashboard(c).dump(2) + "\n", false});

  plan.summary = summary_table(c, plan.assignments);
  for (const auto& w : plan.warnings) plan.summary += "warning: " + w + "\n";
  plan.files.push_back({"plan.json", manifest(c, plan).dump(2) + "\n", false});
  plan.files.push_back(
      {"PLAN.txt",
       fmt::format("moeserve plan for cluster {} (from {})\n\n{}", c.name, c.source, plan.summary), false});
  return plan;
}

void write_plan(const Plan& plan, const std::string& out_dir) {
  for (const auto& f : plan.files) {
    fs::path path = fs::path(out_dir) / f.path;
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    check(!ec, "cannot create {}: {}", path.parent_path().string(), ec.message());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    check(bool(out), "cannot write {}", path.string());
    out << f.content;
    out.close();
    check(bool(out), "cannot write {}", path.string());
    if (f.executable) ::chmod(path.c_str(), 0755);
  }
}

}  // namespace moeserve::deploy
