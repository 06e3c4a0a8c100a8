// moeserve cluster up --local N [--model demo] | status | down: N `moeserve serve` processes and a
// `moeserve route` in front of them on this machine, with a status table and one log per process.
#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "command.h"
#include "deploy/local_cluster.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

struct ClusterCommand {
  moeserve::deploy::LocalClusterOptions up;
  bool foreground = false;
  double refresh = 5;
  std::string dir = ".moeserve-cluster";
  moeserve::deploy::ClusterDownOptions down;
  CLI::App* up_cmd = nullptr;
  CLI::App* status_cmd = nullptr;
  CLI::App* down_cmd = nullptr;
};

std::function<int()> setup(CLI::App& app) {
  auto c = std::make_shared<ClusterCommand>();
  app.require_subcommand(1);
  c->up_cmd = app.add_subcommand("up", "start N servers and a router on this machine");
  auto& u = c->up;
  c->up_cmd->add_option("--local,--nodes", u.nodes, "number of servers")->capture_default_str();
  c->up_cmd->add_option("--model", u.model, "model directory, or demo")->capture_default_str();
  c->up_cmd->add_option("--served-model-name", u.served_model_name,
                        "the model name clients send (default: the --model argument)");
  c->up_cmd->add_option("--cache-memory-gb", u.cache_memory_gb,
                        "KV cache and GDN state per server (default: the server's; 0.05 for the demo model)");
  c->up_cmd->add_option("--base-port", u.base_port, "port of the first server (the next get +1, ...)")
      ->capture_default_str();
  c->up_cmd->add_option("--router-port", u.router_port, "port of the router")->capture_default_str();
  c->up_cmd->add_option("--policy", u.policy, "router policy")->capture_default_str();
  c->up_cmd->add_option("--host", u.host, "address everything listens on")->capture_default_str();
  c->up_cmd->add_option("--dir", u.dir, "state and logs")->capture_default_str();
  c->up_cmd->add_option("--timeout", u.start_timeout, "seconds to wait for every process to be healthy")
      ->capture_default_str();
  c->up_cmd
      ->add_option("--shutdown-timeout", u.shutdown_timeout,
                   "seconds every process gives its requests in flight on SIGTERM before ending them with "
                   "finish_reason \"abort\" (the default of `cluster down --timeout`)")
      ->capture_default_str();
  c->up_cmd->add_option("--serve-arg", u.serve_args, "extra flag for every server (repeat)")
      ->allow_extra_args(false);
  c->up_cmd->add_option("--route-arg", u.route_args, "extra flag for the router (repeat)")
      ->allow_extra_args(false);
  c->up_cmd->add_flag("--foreground", c->foreground,
                      "stay in the foreground, print the status, stop on Ctrl-C");
  c->up_cmd->add_option("--binary", u.binary, "moeserve binary to run (default: this one)")
      ->group("Advanced");

  c->status_cmd = app.add_subcommand("status", "show each process: state, in-flight, KV use, cache hit rate");
  c->status_cmd->add_option("--dir", c->dir, "state and logs")->capture_default_str();
  c->down_cmd = app.add_subcommand(
      "down",
      "stop the router, then the servers; each drains, requests in flight finish or end with \"abort\"");
  c->down_cmd->add_option("--dir", c->dir, "state and logs")->capture_default_str();
  c->down_cmd->add_option("--timeout", c->down.timeout,
                          "seconds the router's, then the servers' requests in flight may finish before they "
                          "end with finish_reason \"abort\" (default: up's --shutdown-timeout, 30)");
  c->down_cmd
      ->add_option("--kill-after", c->down.kill_after,
                   "seconds after that before a process that has not exited is killed (SIGKILL)")
      ->capture_default_str();

  return [c]() -> int {
    using namespace moeserve::deploy;
    if (c->up_cmd->parsed()) {
      LocalClusterState s = cluster_up(c->up);
      std::fputs(format_status(s, cluster_status(s)).c_str(), stdout);
      if (!c->foreground) {
        std::printf("stop with: moeserve cluster down --dir %s\n", s.dir.c_str());
        return 0;
      }
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
      while (!g_stop) {
        for (int i = 0; i < int(c->refresh * 10) && !g_stop; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!g_stop) std::fputs(("\n" + format_status(s, cluster_status(s))).c_str(), stdout);
        std::fflush(stdout);
      }
      int left = cluster_down(s.dir);
      std::printf("stopped%s\n", left ? " (some processes did not exit)" : "");
      return left ? 1 : 0;
    }
    if (c->status_cmd->parsed()) {
      LocalClusterState s = LocalClusterState::load(c->dir);
      std::fputs(format_status(s, cluster_status(s)).c_str(), stdout);
      return 0;
    }
    LocalClusterState s = LocalClusterState::load(c->dir);
    int left = cluster_down(c->dir, c->down);
    if (left) {
      std::fprintf(stderr, "%d process(es) of the cluster in %s are still running\n", left, c->dir.c_str());
      return 1;
    }
    std::printf("stopped %zu processes (logs kept in %s)\n", s.processes.size(), c->dir.c_str());
    return 0;
  };
}

moeserve::app::Registration reg{
    {"cluster", "A local cluster: N servers and a router on this machine", 41, setup}};

}  // namespace
