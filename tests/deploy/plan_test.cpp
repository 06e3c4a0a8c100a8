#include "deploy/plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "deploy/decode_bound.h"
#include "deploy/structured_file.h"

namespace moeserve::deploy {
namespace {

ClusterSpec parse(const std::string& yaml) {
  return ClusterSpec::parse(parse_structured_text(yaml, "test.yaml"), "test.yaml", ".");
}

std::string refusal(const std::string& yaml) {
  try {
    make_plan(parse(yaml));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const PlanFile* find_file(const Plan& p, const std::string& path) {
  for (const auto& f : p.files)
    if (f.path == path) return &f;
  return nullptr;
}

const char* kPair = R"(
defaults: {gpu: gb10, nic: enp1s0f0np0}
nodes:
  - {name: s1, host: 10.0.0.1}
  - {name: s2, host: 10.0.0.2}
models:
  - {name: big, path: /models/big, preset: qwen3.5-122b-a10b, dtype: fp8, nodes: [[s1, s2]]}
router: {host: 10.0.0.9}
)";

// The summary gives each model's decode bound on its GPU kind at batch 1 and at max_running_requests: the
// figures decode_step_bytes gives for the model as planned, over a GB10's 273 GB/s.
TEST(Plan, SummaryStatesEachModelsDecodeBound) {
  const ClusterSpec c = parse(kPair);  // the assignments point into it
  Plan p = make_plan(c);
  ASSERT_FALSE(p.assignments.empty());
  const ModelSpec& m = *p.assignments[0].model;
  EXPECT_EQ(m.precision.weights, "fp8");
  for (int64_t batch : {int64_t(1), int64_t(m.max_running_requests)}) {
    const DecodeStepBytes b = decode_step_bytes(m.resolved_config, m.precision, 2, batch, 8192);
    const std::string want = fmt::format("batch {} {:.0f} tok/s", batch, double(batch) / b.seconds(273e9));
    EXPECT_NE(p.summary.find(want), std::string::npos) << want << "\n" << p.summary;
  }
  EXPECT_NE(p.summary.find("big on gb10 (273.0 GB/s, tp 2), contexts of 8192 tokens"), std::string::npos)
      << p.summary;
}

TEST(Plan, TpPairLaunchLines) {
  Plan p = make_plan(parse(kPair));
  ASSERT_EQ(p.assignments.size(), 2u);
  const PlanFile* rank1 = find_file(p, "nodes/s2/serve.sh");
  ASSERT_NE(rank1, nullptr);
  for (const char* want :
       {"--device cuda", "--tp 2", "--nnodes 2", "--node-rank 1", "--dist-init-addr 10.0.0.1:29500",
        "--port 30000", "--cache-memory-gb", "--max-running-requests 16", "--reasoning-parser qwen3",
        "--memory-pressure-threshold 0.95", "--tool-call-parser qwen3_coder",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1", "export NCCL_SOCKET_IFNAME=enp1s0f0np0"})
    EXPECT_NE(rank1->content.find(want), std::string::npos) << want << "\n" << rank1->content;
  const PlanFile* docker = find_file(p, "nodes/s1/docker-run.sh");
  ASSERT_NE(docker, nullptr);
  for (const char* want :
       {"--platform linux/arm64", "--gpus all", "--ipc=host", "--shm-size 64g",
        "-e CUDA_DEVICE_MAX_CONNECTIONS=1", "moeserve:aarch64-sm121 serve", "--node-rank 0"})
    EXPECT_NE(docker->content.find(want), std::string::npos) << want << "\n" << docker->content;
  // The router and Prometheus reach rank 0 only: the other rank follows it and serves no HTTP.
  const PlanFile* route = find_file(p, "router/router.yaml");
  ASSERT_NE(route, nullptr);
  EXPECT_NE(route->content.find("{url: \"http://10.0.0.1:30000\", models: [\"big\"]}"), std::string::npos)
      << route->content;
  EXPECT_EQ(route->content.find("10.0.0.2"), std::string::npos);
  const PlanFile* prom = find_file(p, "monitoring/prometheus.yml");
  EXPECT_EQ(prom->content.find("10.0.0.2:30000"), std::string::npos);
}

// kv_cache_dtype sizes the KV cache by the bytes serve will store and is passed to serve, so the two agree.
TEST(Plan, KvCacheDtypeSizesTheCacheAndReachesServe) {
  auto with_kv = [](const std::string& kv) {
    std::string yaml = kPair;
    const std::string at = "dtype: fp8";
    yaml.replace(yaml.find(at), at.size(), at + (kv.empty() ? "" : ", kv_cache_dtype: " + kv));
    return yaml;
  };
  Plan bf16 = make_plan(parse(with_kv(""))), fp8 = make_plan(parse(with_kv("fp8_e4m3")));
  const double per_token_bf16 = bf16.assignments[0].fit.per_rank.kv_per_token;
  EXPECT_DOUBLE_EQ(fp8.assignments[0].fit.per_rank.kv_per_token, per_token_bf16 / 2);
  EXPECT_DOUBLE_EQ(make_plan(parse(with_kv("float32"))).assignments[0].fit.per_rank.kv_per_token,
                   2 * per_token_bf16);
  EXPECT_NE(find_file(bf16, "nodes/s1/serve.sh")->content.find("--kv-cache-dtype bf16"), std::string::npos);
  EXPECT_NE(find_file(fp8, "nodes/s1/serve.sh")->content.find("--kv-cache-dtype fp8"), std::string::npos);
  EXPECT_NE(refusal(with_kv("fp8_e5m2")).find("kv_cache_dtype 'fp8_e5m2' is not one of"), std::string::npos);
}

// Every launch file names the plan's device: serve's own default (auto) would take a GPU that a gpu: cpu node
// happens to have.
TEST(Plan, GpuNodesServeOnCudaCpuNodesOnTheCpu) {
  Plan p = make_plan(parse(R"(
nodes:
  - {name: g, host: 10.0.0.1, gpu: gb10}
  - {name: c, host: 10.0.0.2, gpu: cpu, arch: x86_64, memory: 512GB}
models:
  - {name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [g, c]}
router: {host: 10.0.0.9}
)"));
  EXPECT_TRUE(p.warnings.empty());
  for (const char* file : {"serve.sh", "moeserve.service", "docker-run.sh"}) {
    SCOPED_TRACE(file);
    const std::string& gpu = find_file(p, std::string("nodes/g/") + file)->content;
    const std::string& cpu = find_file(p, std::string("nodes/c/") + file)->content;
    EXPECT_NE(gpu.find("--device cuda"), std::string::npos) << gpu;
    EXPECT_NE(cpu.find("--device cpu"), std::string::npos) << cpu;
    EXPECT_EQ(cpu.find("--device cuda"), std::string::npos) << cpu;
    EXPECT_EQ(cpu.find("--gpus"), std::string::npos) << cpu;
    EXPECT_EQ(gpu.find("NOT STARTABLE"), std::string::npos) << gpu;
  }
  auto manifest = nlohmann::json::parse(find_file(p, "plan.json")->content);
  EXPECT_NE(manifest["nodes"][0]["command"].get<std::string>().find(" --device cuda "), std::string::npos);
}

// serve refuses --tp > 1 with --device cuda until NCCL is wired in: plan still writes the lines (they are
// what serve will take) but says, in the summary and at the top of every file, that they cannot start.
TEST(Plan, TpGroupsSayTheyCannotStartYet) {
  Plan p = make_plan(parse(kPair));
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("big (tp 2) will not start on s1, s2: `moeserve serve` refuses --tp 2 with "
                               "--device cuda"),
            std::string::npos)
      << p.warnings[0];
  EXPECT_NE(p.summary.find("warning: big (tp 2) will not start"), std::string::npos);
  for (const char* file : {"nodes/s1/serve.sh", "nodes/s2/moeserve.service", "nodes/s2/docker-run.sh"}) {
    const std::string& text = find_file(p, file)->content;
    EXPECT_NE(text.find("# NOT STARTABLE YET: `moeserve serve` refuses --tp 2 with --device cuda"),
              std::string::npos)
        << file << "\n"
        << text;
  }
  // On CPU nodes the ranks must run under mpirun, which per-node files do not do.
  Plan cpu = make_plan(parse(R"(
defaults: {gpu: cpu, arch: x86_64, memory: 1TB}
nodes: [{name: a, host: 10.0.0.1}, {name: b, host: 10.0.0.2}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [[a, b]]}]
router: {host: 10.0.0.9}
)"));
  ASSERT_EQ(cpu.warnings.size(), 1u);
  EXPECT_NE(cpu.warnings[0].find("runs one process per rank under mpirun"), std::string::npos)
      << cpu.warnings[0];
  EXPECT_NE(find_file(cpu, "nodes/a/serve.sh")->content.find("--device cpu"), std::string::npos);
}

TEST(Plan, NginxCarriesTheReferenceTuning) {
  Plan p = make_plan(ClusterSpec::load("deploy/cluster-spark9.yaml"));
  const std::string& conf = find_file(p, "router/nginx.conf")->content;
  for (const char* want :
       {"least_conn;", "server 10.0.0.11:30000 max_fails=3 fail_timeout=30s;",
        "server 10.0.0.19:30000 max_fails=3 fail_timeout=30s;", "keepalive 32;", "keepalive_timeout 300s;",
        "proxy_read_timeout 300s;", "proxy_send_timeout 300s;", "proxy_buffering off;",
        "proxy_http_version 1.1;", "proxy_set_header Connection \"\";", "listen 8000;"})
    EXPECT_NE(conf.find(want), std::string::npos) << want;
}

TEST(Plan, RefusesAModelThatDoesNotFitAndSaysWhatWould) {
  std::string e = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}, {name: s2, host: 10.0.0.2}]
models:
  - {name: big, path: /models/big, preset: qwen3.5-122b-a10b, dtype: bf16, nodes: [[s1, s2]]}
)");
  EXPECT_NE(e.find("big (bf16, preset qwen3.5-122b-a10b, tp 2) does not fit gb10 at mem_fraction 0.85"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Would fit: dtype fp8"), std::string::npos) << e;
  EXPECT_NE(e.find("[nodes: s1+s2]"), std::string::npos) << e;
}

TEST(Plan, IdenticalRefusalsAreReportedOnceWithTheirNodes) {
  std::string e = refusal(R"(
defaults: {gpu: h100}
nodes: [{name: a, host: 10.0.0.1}, {name: b, host: 10.0.0.2}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: bf16, nodes: [a, b]}]
)");
  EXPECT_NE(e.find("(1 problem)"), std::string::npos) << e;
  EXPECT_NE(e.find("[nodes: a, b]"), std::string::npos) << e;
  EXPECT_NE(e.find("dtype fp8"), std::string::npos) << e;  // 35B in FP8 fits an 80 GB H100
}

TEST(Plan, RefusesPortCollisions) {
  std::string e = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}, {name: s2, host: 10.0.0.2}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1, s2]}]
router: {host: 10.0.0.1, port: 30000}
)");
  EXPECT_NE(e.find("port 30000 on 10.0.0.1 is used twice: by moeserve serve on s1 and by the router"),
            std::string::npos)
      << e;

  // Two node entries for one machine: both servers want its port 30000.
  std::string twice = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}, {name: s1-again, host: 10.0.0.1}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1, s1-again]}]
router: {host: 10.0.0.9}
)");
  EXPECT_NE(twice.find("port 30000 on 10.0.0.1 is used twice"), std::string::npos) << twice;

  std::string prom = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1]}]
router: {host: 10.0.0.9, port: 9090}
)");
  EXPECT_NE(prom.find("by the router and by Prometheus"), std::string::npos) << prom;
}

TEST(Plan, RefusesImagesOfTheWrongArchitecture) {
  // An x86/Hopper image on GB10 dies with "Illegal instruction" or fails to load its kernels.
  std::string e = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}]
images:
  aarch64: {image: "moeserve:hopper", cuda_archs: [sm_90a]}
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1]}]
router: {host: 10.0.0.9}
)");
  EXPECT_NE(e.find("image moeserve:hopper carries kernels for sm_90a only"), std::string::npos) << e;
  EXPECT_NE(e.find("Dockerfile.aarch64-sm121"), std::string::npos) << e;

  std::string missing = refusal(R"(
defaults: {gpu: gb10}
nodes: [{name: s1, host: 10.0.0.1}]
images:
  x86_64: {image: "moeserve:x86", cuda_archs: [sm_90a]}
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1]}]
router: {host: 10.0.0.9}
)");
  EXPECT_NE(missing.find("no image is given for aarch64"), std::string::npos) << missing;

  std::string arch = refusal(R"(
nodes: [{name: s1, host: 10.0.0.1, gpu: gb10, arch: x86_64}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, nodes: [s1]}]
router: {host: 10.0.0.9}
)");
  EXPECT_NE(arch.find("a gb10 sits in aarch64 hosts, not x86_64"), std::string::npos) << arch;
}

TEST(Plan, LargeSparkTpGroupsAreExperimental) {
  const std::string base = R"(
defaults: {gpu: gb10}
nodes: [{name: a, host: 10.0.0.1}, {name: b, host: 10.0.0.2}, {name: c, host: 10.0.0.3}, {name: d, host: 10.0.0.4}]
router: {host: 10.0.0.9}
models:
  - name: big
    path: /m
    preset: qwen3.5-397b-a17b
    dtype: fp8
    max_running_requests: 8
    nodes: [[a, b, c, d]]
)";
  std::string e = refusal(base);
  EXPECT_NE(e.find("a TP group of 4 DGX Spark nodes is experimental"), std::string::npos) << e;
  EXPECT_NE(e.find("set experimental: true"), std::string::npos) << e;
  Plan p = make_plan(parse(base + "    experimental: true\n"));
  ASSERT_EQ(p.warnings.size(), 2u);  // and that serve cannot run tp 4 on CUDA yet (TpOnGpusIsFlagged)
  EXPECT_NE(p.summary.find("warning: big: a TP group of 4 DGX Spark nodes is experimental"),
            std::string::npos);
}

TEST(Plan, RefusesEverythingAtOnce) {
  std::string e = refusal(R"(
nodes: [{name: a, host: 10.0.0.1, gpu: a100}]
models:
  - {name: m, path: /m, preset: qwen3.5-35b-a3b, dtype: fp8, max_model_len: 1000000, nodes: [a]}
  - {name: n, path: /m, preset: qwen3.5-35b-a3b, dtype: bf16, nodes: [a], port: 30001}
router: {host: 10.0.0.9}
)");
  EXPECT_NE(e.find("exceeds the model's max_position_embeddings 262144"), std::string::npos) << e;
  EXPECT_NE(e.find("no FP8 tensor cores"), std::string::npos) << e;
  EXPECT_NE(e.find("node a is given to both m (rank 0) and n (rank 0)"), std::string::npos) << e;
}

TEST(Plan, ManifestAndDashboardAreJson) {
  Plan p = make_plan(ClusterSpec::load("deploy/cluster-mixed-4xtp2-1.yaml"));
  auto manifest = nlohmann::json::parse(find_file(p, "plan.json")->content);
  EXPECT_EQ(manifest["nodes"].size(), 9u);
  EXPECT_EQ(manifest["nodes"][1]["rank"], 1);
  EXPECT_EQ(manifest["models"][1]["router"], "http://10.0.0.10:8000");  // one router for both models
  EXPECT_EQ(manifest["models"][1]["nginx"], "http://10.0.0.10:8001");   // nginx: a port per model
  EXPECT_NO_THROW(nlohmann::json::parse(find_file(p, "monitoring/grafana-dashboard.json")->content));
}

}  // namespace
}  // namespace moeserve::deploy
