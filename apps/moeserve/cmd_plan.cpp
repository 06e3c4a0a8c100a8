// moeserve plan --cluster cluster.yaml --out DIR: checks a cluster description and writes every file the
// deployment needs (launch scripts, systemd units, container run lines, router and nginx configs, Prometheus
// config and alerts, a Grafana dashboard). docs/operations.md walks through it.
#include <cstdio>

#include "command.h"
#include "common/error.h"
#include "deploy/cluster_spec.h"
#include "deploy/plan.h"

namespace {

struct PlanOptions {
  std::string cluster;
  std::string out;
  bool check_only = false;
};

std::function<int()> setup(CLI::App& app) {
  auto opt = std::make_shared<PlanOptions>();
  app.add_option("--cluster", opt->cluster, "cluster description (YAML or JSON); see deploy/cluster-*.yaml")
      ->required();
  app.add_option("--out", opt->out, "directory to write the plan into");
  app.add_flag("--check", opt->check_only, "only check the cluster and print the summary; write nothing");
  return [opt]() -> int {
    using namespace moeserve::deploy;
    moeserve::check(opt->check_only || !opt->out.empty(), "plan: give --out DIR (or --check to only check)");
    ClusterSpec cluster = ClusterSpec::load(opt->cluster);
    Plan plan = make_plan(cluster);
    std::fputs(plan.summary.c_str(), stdout);
    if (opt->check_only) return 0;
    write_plan(plan, opt->out);
    std::printf("\nwrote %zu files to %s (start with %s/PLAN.txt)\n", plan.files.size(), opt->out.c_str(),
                opt->out.c_str());
    return 0;
  };
}

moeserve::app::Registration reg{
    {"plan", "Check a cluster.yaml and write launch, router and monitoring files", 40, setup}};

}  // namespace
