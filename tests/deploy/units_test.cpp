#include "deploy/units.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "deploy/gpus.h"

namespace moeserve::deploy {
namespace {

TEST(Units, ParsesDecimalAndBinarySizes) {
  EXPECT_EQ(parse_bytes("128GB", "x"), 128'000'000'000u);
  EXPECT_EQ(parse_bytes("128 GiB", "x"), 128ull << 30);
  EXPECT_EQ(parse_bytes("64g", "x"), 64ull << 30);  // docker --shm-size style
  EXPECT_EQ(parse_bytes("512m", "x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("1.5TB", "x"), 1'500'000'000'000u);
  EXPECT_EQ(parse_bytes("4096", "x"), 4096u);
}

TEST(Units, RejectsMalformedSizesNamingTheField) {
  try {
    parse_bytes("lots", "nodes[2].memory");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nodes[2].memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_bytes("12XB", "x"), Error);
}

TEST(Units, ParsesDurations) {
  EXPECT_DOUBLE_EQ(parse_seconds("30s", "x"), 30);
  EXPECT_DOUBLE_EQ(parse_seconds("5m", "x"), 300);
  EXPECT_DOUBLE_EQ(parse_seconds("1h", "x"), 3600);
  EXPECT_DOUBLE_EQ(parse_seconds("250ms", "x"), 0.25);
  EXPECT_DOUBLE_EQ(parse_seconds("300", "x"), 300);
  EXPECT_THROW(parse_seconds("5 days", "x"), Error);
  EXPECT_EQ(format_seconds(300), "300s");
  EXPECT_EQ(format_seconds(0.25), "250ms");
}

TEST(Gpus, KnowsSparkAndH200) {
  const GpuKind* spark = find_gpu("gb10");
  ASSERT_NE(spark, nullptr);
  EXPECT_EQ(spark->compute_capability, 121);
  EXPECT_EQ(spark->host_arch, "aarch64");
  EXPECT_TRUE(spark->unified_memory);
  // nvidia-smi product names resolve too, and GH200 is not mistaken for H200.
  EXPECT_EQ(find_gpu("NVIDIA H200")->key, "h200");
  EXPECT_EQ(find_gpu("NVIDIA GH200 480GB")->key, "gh200");
  EXPECT_EQ(find_gpu("nope"), nullptr);
}

TEST(Gpus, CudaArchCompatibility) {
  EXPECT_TRUE(cuda_arch_runs_on(parse_cuda_arch("sm_121"), 121));
  EXPECT_TRUE(cuda_arch_runs_on(parse_cuda_arch("sm_120"), 121));   // same major, older minor
  EXPECT_FALSE(cuda_arch_runs_on(parse_cuda_arch("sm_90a"), 121));  // Hopper kernels on GB10
  EXPECT_FALSE(cuda_arch_runs_on(parse_cuda_arch("sm_100a"), 121));
  EXPECT_TRUE(cuda_arch_runs_on(parse_cuda_arch("12.1"), 121));
  EXPECT_EQ(normalize_arch("arm64"), "aarch64");
  EXPECT_EQ(normalize_arch("amd64"), "x86_64");
  EXPECT_EQ(docker_platform("aarch64"), "linux/arm64");
}

}  // namespace
}  // namespace moeserve::deploy
