#pragma once
// `moeserve plan`: cluster.yaml -> every file a deployment needs, after checking that it can work. A plan
// that cannot work is refused with every reason at once, each saying what would fit instead.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deploy/cluster_spec.h"
#include "deploy/footprint.h"

namespace moeserve::deploy {

// One server process: a node running one rank of one replica of a model.
struct Assignment {
  const NodeSpec* node = nullptr;
  const ModelSpec* model = nullptr;
  int replica = 0;  // 0-based
  int rank = 0;     // node rank within the replica (0 serves HTTP)
  int nnodes = 1;
  const NodeSpec* leader = nullptr;  // rank 0 of the replica
  FitResult fit;
};

struct PlanFile {
  std::string path;  // relative to the output directory
  std::string content;
  bool executable = false;
};

struct Plan {
  std::vector<Assignment> assignments;
  std::vector<std::string> warnings;
  std::vector<PlanFile> files;
  std::string summary;  // what `moeserve plan` prints
};

// Checks and renders; throws moeserve::Error listing every refusal.
Plan make_plan(const ClusterSpec& cluster);

// Writes the files under out_dir (created; existing files are replaced).
void write_plan(const Plan& plan, const std::string& out_dir);

// Renderers (plan_render_*.cpp); exposed for tests.
std::string render_serve_args(const ClusterSpec& c, const Assignment& a);  // "serve --model ... " (no binary)
std::string render_launch_script(const ClusterSpec& c, const Assignment& a);
std::string render_systemd_unit(const ClusterSpec& c, const Assignment& a);
std::string render_docker_run(const ClusterSpec& c, const Assignment& a);
std::string render_router_config(const ClusterSpec& c, const std::vector<Assignment>& all);  // router.yaml
std::string render_router_script(const ClusterSpec& c);
std::string render_router_unit(const ClusterSpec& c);
std::string render_nginx_conf(const ClusterSpec& c, const std::vector<Assignment>& all);
std::string render_prometheus_config(const ClusterSpec& c, const std::vector<Assignment>& all);
std::string render_alert_rules(const ClusterSpec& c);
nlohmann::json render_grafana_dashboard(const ClusterSpec& c);

// Whether the node's gpu kind is a GPU ("cpu" is not): its server runs --device cuda.
bool node_has_gpu(const NodeSpec& n);
// The model's tokens per step on that node: prefill_chunk, or the node's GPU kind's step_tokens.
int step_tokens(const ModelSpec& m, const NodeSpec& n);

// Why a replica's launch files cannot start today, or "": `moeserve serve` refuses --tp > 1 with --device
// cuda (NCCL is not wired into serve yet) and runs CPU ranks only under mpirun (docs/tp.md).
std::string tp_launch_limit(const ModelSpec& m, const NodeSpec& leader);

// Shell quoting for generated scripts: 'text' when it needs it.
std::string shell_quote(const std::string& s);

}  // namespace moeserve::deploy
