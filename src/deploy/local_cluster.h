#pragma once
// `moeserve cluster`: N `moeserve serve` processes and a `moeserve route` in front of them on this machine, a
// live miniature of the deployment. The state (pids, ports, logs) lives in a directory so that `status` and
// `down` work from any later shell; `down` stops only the processes it recorded, by pid and start time.
//
// `down` stops the cluster in stages, so that no request in flight is cut: the router first (it stops
// accepting; its streams finish or, at the deadline, end with finish_reason "abort" and [DONE]), then the
// servers, which have nothing from the router left and drain what clients sent them directly the same way.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moeserve::deploy {

struct LocalClusterOptions {
  int nodes = 3;
  std::string model = "demo";
  std::string served_model_name;  // the name clients send (default: --model as given, so "demo")
  double cache_memory_gb = -1;    // KV cache + GDN state per server; -1: the server's default, 0.05 for demo
  std::string host = "127.0.0.1";
  int base_port = 30001;  // node i listens on base_port + i
  int router_port = 8000;
  std::string policy = "least_conn";
  std::string dir = ".moeserve-cluster";  // state file and one log per process
  std::string binary;                     // moeserve to run (default: this executable)
  double start_timeout = 300;             // seconds for every process to report healthy
  double shutdown_timeout = 30;           // every process's --shutdown-timeout: its drain deadline on SIGTERM
  std::vector<std::string> serve_args;    // extra flags for every server
  std::vector<std::string> route_args;    // extra flags for the router
};

struct LocalProcess {
  std::string name;  // node-1, ..., router
  std::string role;  // server | router
  int pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells our process from a later one with the same pid
  int port = 0;
  std::string log;
};

struct LocalClusterState {
  std::string dir, model, host, binary;
  double shutdown_timeout = 30;  // the processes' own drain deadline (LocalClusterOptions::shutdown_timeout)
  std::vector<LocalProcess> processes;
  nlohmann::json to_json() const;
  static LocalClusterState from_json(const nlohmann::json& j);
  static LocalClusterState load(const std::string& dir);  // throws when there is no cluster there
};

// Starts everything and waits until each /health answers 200. On failure stops what it started and throws
// with the failing process's log tail.
LocalClusterState cluster_up(const LocalClusterOptions& options);

struct ProcessStatus {
  LocalProcess process;
  bool alive = false;
  std::string state;  // ready | starting | unhealthy (HTTP nnn) | exited
  double running = -1, waiting = -1, kv_usage = -1, cache_hit_rate = -1;  // -1: not reported
};
std::vector<ProcessStatus> cluster_status(const LocalClusterState& state);
std::string format_status(const LocalClusterState& state, const std::vector<ProcessStatus>& status);

struct ClusterDownOptions {
  // Seconds a stage's requests in flight may finish before a second SIGTERM ends them (finish_reason "abort",
  // as the processes do at their own deadline); -1: the cluster's shutdown_timeout. A longer one does not
  // extend the processes' own deadline.
  double timeout = -1;
  double kill_after = 15;  // seconds from that second SIGTERM to SIGKILL (a process that does not exit)
};

// Stage by stage, the router, then the servers: SIGTERM (they drain), a second SIGTERM at the timeout,
// SIGKILL `kill_after` later. Returns how many of the recorded processes are still alive afterwards (0 on
// success) and removes the state file when none is.
int cluster_down(const std::string& dir, const ClusterDownOptions& options = {});

// Whether pid is our process (alive, not a zombie, same start time).
bool process_alive(int pid, uint64_t start_time);
uint64_t process_start_time(int pid);  // 0 when there is no such process

}  // namespace moeserve::deploy
