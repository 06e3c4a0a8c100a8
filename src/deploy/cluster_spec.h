#pragma once
// cluster.yaml: the nodes of a deployment, the models placed on them, the router and monitoring settings.
// deploy/cluster-spark9.yaml documents every field; parse() rejects unknown keys (typos) with the field path.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "deploy/footprint.h"
#include "model/config.h"

namespace moeserve::deploy {

struct NodeSpec {
  std::string name;
  std::string host;   // address the router, Prometheus and TP peers reach it at
  std::string arch;   // aarch64 | x86_64
  std::string gpu;    // a key of gpu_kinds()
  int gpus = 1;       // GPUs used on this node
  double memory = 0;  // bytes per GPU (unified: system memory); default from the GPU table
  std::string nic;    // interface of the TP link (NCCL_SOCKET_IFNAME), optional
};

struct ImageSpec {
  std::string arch;                     // aarch64 | x86_64
  std::string image;                    // registry/name:tag
  std::vector<std::string> cuda_archs;  // what the image's kernels were built for: sm_121, sm_90a, ...
};

struct ModelSpec {
  std::string name;     // served model name (the OpenAI "model" field)
  std::string path;     // checkpoint directory on the nodes
  std::string config;   // a config.json readable here, or "" (then path/config.json, then the preset)
  std::string preset;   // one of known_model_presets()
  Precision precision;  // weights from dtype, KV from kv_cache_dtype (auto: bf16); GDN state fp32
  int64_t max_model_len = 32768;
  int max_running_requests = 16;
  double mem_fraction = 0.85;
  int prefill_chunk = 0;  // tokens per step (serve --max-num-batched-tokens); 0 = the GPU kind's step_tokens
  std::vector<std::vector<std::string>> replicas;  // each replica: its nodes, rank order
  int tp = 1;                                      // GPUs per replica (derived from the nodes when not given)
  int port = 30000;
  int dist_port = 29500;      // rendezvous port on rank 0 of a multi-node replica
  bool experimental = false;  // acknowledges a TP group of more than two Spark nodes
  int router_port = 0;        // nginx port of this model (default router.port + index); moeserve route
                              // serves every model on router.port and picks backends by the request's model
  std::vector<std::string> extra_args;

  ModelConfig resolved_config;  // filled by ClusterSpec::parse
  std::string config_source;    // where resolved_config came from (for the summary)
};

struct RouterSpec {
  std::string host;    // where `moeserve route` and nginx run
  std::string listen;  // listen address ("" = all)
  int port = 8000;
  std::string policy = "least_conn";
  int max_fails = 3;
  double fail_timeout = 30;
  int keepalive = 32;
  double keepalive_timeout = 300;
  double read_timeout = 300;
  double send_timeout = 300;
  double health_interval = 10;
};

struct AlertSpec {
  double error_rate = 0.05;       // fraction of requests failing over 5 minutes
  double memory_pressure = 0.90;  // used / total memory on a node
  double kv_usage = 0.95;         // KV cache use
  double ttft_p99_seconds = 10;   // time to first token, 99th percentile over 5 minutes
  double node_down_for = 60;      // seconds a target may be unreachable before it pages
};

struct MonitoringSpec {
  std::string prometheus_host;
  int prometheus_port = 9090;
  double scrape_interval = 15;
  int grafana_port = 3000;
  AlertSpec alerts;
};

struct InstallSpec {
  std::string binary = "/usr/local/bin/moeserve";  // on the nodes
  std::string user = "moeserve";
  std::string config_dir = "/etc/moeserve";  // where router.yaml goes on the router host
  std::string shm_size = "64g";              // container /dev/shm
  double shutdown_timeout = 300;             // drain time on stop
};

struct ClusterSpec {
  std::string name;
  std::string source;  // file name, for messages
  std::vector<NodeSpec> nodes;
  std::vector<ImageSpec> images;
  std::vector<ModelSpec> models;
  RouterSpec router;
  MonitoringSpec monitoring;
  InstallSpec install;

  const NodeSpec* node(const std::string& name) const;
  const ImageSpec* image_for(const std::string& arch) const;

  // Structural parsing: types, required fields, unknown keys, references between sections. Feasibility
  // (memory, ports, images) is plan's job. `base_dir` resolves relative config paths.
  static ClusterSpec parse(const nlohmann::json& root, const std::string& source,
                           const std::string& base_dir);
  static ClusterSpec load(const std::string& path);
};

}  // namespace moeserve::deploy
