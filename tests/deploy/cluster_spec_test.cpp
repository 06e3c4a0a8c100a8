#include "deploy/cluster_spec.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "deploy/structured_file.h"

namespace moeserve::deploy {
namespace {

ClusterSpec parse(const std::string& yaml) {
  return ClusterSpec::parse(parse_structured_text(yaml, "test.yaml"), "test.yaml", ".");
}

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = R"(
nodes:
  - {name: a, host: 10.0.0.1, gpu: gb10}
models:
  - {name: m, path: /models/m, preset: qwen3.5-35b-a3b, nodes: [a]}
)";

TEST(ClusterSpec, DefaultsFromTheGpuTable) {
  ClusterSpec c = parse(kMinimal);
  ASSERT_EQ(c.nodes.size(), 1u);
  EXPECT_EQ(c.nodes[0].arch, "aarch64");  // GB10 hosts are aarch64
  EXPECT_DOUBLE_EQ(c.nodes[0].memory, 128e9);
  EXPECT_EQ(c.models[0].tp, 1);
  EXPECT_EQ(c.models[0].port, 30000);
  EXPECT_DOUBLE_EQ(c.models[0].mem_fraction, 0.85);
  EXPECT_EQ(c.models[0].router_port, 8000);
  EXPECT_EQ(c.router.policy, "least_conn");
  EXPECT_EQ(c.router.max_fails, 3);
  EXPECT_DOUBLE_EQ(c.router.fail_timeout, 30);
  EXPECT_EQ(c.images.size(), 2u);  // the images deploy/docker builds
  EXPECT_EQ(c.models[0].resolved_config.num_layers, 40);
}

TEST(ClusterSpec, ExampleFilesParse) {
  ClusterSpec nine = ClusterSpec::load("deploy/cluster-spark9.yaml");
  EXPECT_EQ(nine.nodes.size(), 9u);
  EXPECT_EQ(nine.models[0].replicas.size(), 9u);
  ClusterSpec mixed = ClusterSpec::load("deploy/cluster-mixed-4xtp2-1.yaml");
  ASSERT_EQ(mixed.models.size(), 2u);
  EXPECT_EQ(mixed.models[0].tp, 2);
  EXPECT_EQ(mixed.models[0].replicas.size(), 4u);
  EXPECT_EQ(mixed.models[1].router_port, 8001);
  EXPECT_EQ(mixed.nodes[0].nic, "enp1s0f0np0");
}

TEST(ClusterSpec, ReadsTheCheckpointConfigWhenGiven) {
  ClusterSpec c = parse(R"(
nodes: [{name: a, gpu: h200}]
models:
  - {name: m, path: /nowhere, config: tests/fixtures/models/small-moe-realdims-fp8/config.json, nodes: [a]}
)");
  EXPECT_EQ(c.models[0].resolved_config.hidden_size, 256);
  EXPECT_EQ(c.models[0].precision.weights, "fp8");  // implied by quantization_config
}

TEST(ClusterSpec, TyposAreErrorsWithTheFieldPath) {
  std::string e = error_of(R"(
nodes: [{name: a, gpu: gb10}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, nodes: [a]}]
router: {max_fail: 3}
)");
  EXPECT_NE(e.find("unknown key 'max_fail' in router"), std::string::npos) << e;
  EXPECT_NE(e.find("max_fails"), std::string::npos) << e;  // the known keys are listed
}

TEST(ClusterSpec, ClearErrors) {
  EXPECT_NE(error_of("nodes: []\nmodels: []").find("'nodes' must be a non-empty list"), std::string::npos);
  EXPECT_NE(error_of(R"(
nodes: [{name: a, gpu: tpu}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, nodes: [a]}]
)")
                .find("unknown GPU 'tpu'"),
            std::string::npos);
  EXPECT_NE(error_of(R"(
nodes: [{name: a, gpu: gb10}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, nodes: [b]}]
)")
                .find("'b', which is not in 'nodes'"),
            std::string::npos);
  EXPECT_NE(error_of(R"(
nodes: [{name: a, gpu: gb10}]
models: [{name: m, path: /nowhere, nodes: [a]}]
)")
                .find("set 'config' to a copy of it or 'preset'"),
            std::string::npos);
  EXPECT_NE(error_of(R"(
nodes: [{name: a, gpu: gb10}, {name: b, gpu: gb10}, {name: c, gpu: gb10}]
models: [{name: m, path: /m, preset: qwen3.5-35b-a3b, nodes: [[a, b], [c]]}]
)")
                .find("replica 2 has 1 GPUs but tp is 2"),
            std::string::npos);
  EXPECT_NE(error_of("nodes: [{name: a, gpu: gb10, memory: lots}]\nmodels: []").find("nodes[0].memory"),
            std::string::npos);
  EXPECT_NE(error_of("nodes:\n  - name: a\n   bad indent: [").find("invalid YAML"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::deploy
