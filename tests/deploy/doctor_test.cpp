// doctor against a fake host: a directory standing in for / (proc/, sys/, dev/ files), a shell script
// standing in for nvidia-smi and hand-made ELF headers. Each bad case operators hit must fail or warn with
// its fix.
#include "deploy/doctor.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using testing::run_command;
using testing::TempDir;
using testing::write_file;

// A minimal ELF header: magic, 64-bit, little endian, e_machine at offset 18.
void write_elf(const std::string& path, int machine) {
  std::string h(64, '\0');
  h[0] = 0x7f, h[1] = 'E', h[2] = 'L', h[3] = 'F', h[4] = 2, h[5] = 1, h[6] = 1;
  h[18] = char(machine & 0xff), h[19] = char(machine >> 8);
  write_file(path, h);
}

// A healthy DGX Spark, file by file; tests break one thing each.
class FakeHost {
 public:
  FakeHost() {
    file("proc/sys/kernel/arch", "aarch64\n");
    meminfo(128e9, 110e9);
    file("proc/mounts", "proc /proc proc rw 0 0\nshm /dev/shm tmpfs rw,nosuid,nodev,size=67108864k 0 0\n");
    file("dev/nvidia0", "");
    file("dev/nvidiactl", "");
    file("proc/driver/nvidia/version",
         "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
         "(dvs-builder)\n");
    file("proc/net/tcp",
         "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
         "   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
         "   1: 0100007F:7530 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n");
    limits(1048576);
    smi("echo 'NVIDIA GB10, 12.1, [N/A], [N/A], 580.95.05'");
    write_elf(dir / "moeserve", 183);
    options.root = dir.path();
    options.binary = dir / "moeserve";
    options.nvidia_smi = dir / "nvidia-smi";
    options.cuda_visible_devices = "<unset>";
  }
  void file(const std::string& rel, const std::string& content) { write_file(dir / rel, content); }
  void meminfo(double total, double available) {
    file("proc/meminfo",
         fmt::format("MemTotal:       {} kB\nMemFree:        1000 kB\nMemAvailable:   {} kB\n",
                     int64_t(total / 1024), int64_t(available / 1024)));
  }
  void limits(int64_t nofile) {
    file("proc/self/limits",
         fmt::format("Limit                     Soft Limit           Hard Limit           Units     \n"
                     "Max open files            {0:<20} {0:<20} files     \n"
                     "Max locked memory         8388608              8388608              bytes     \n",
                     nofile));
  }
  void smi(const std::string& body) {
    file("nvidia-smi", "#!/bin/sh\n" + body + "\n");
    ::chmod((dir / "nvidia-smi").c_str(), 0755);
  }
  // The binary's build is a fact about this process, not the fake root: tests inject it.
  HostFacts probe() const {
    HostFacts f = probe_host(options);
    f.build = build;
    return f;
  }
  std::vector<DoctorCheck> run() const { return check_host(probe(), options); }

  TempDir dir;
  DoctorOptions options;
  BuildInfo build{true, {"121"}};  // the aarch64-sm121 image's moeserve
};

const DoctorCheck* find(const std::vector<DoctorCheck>& checks, const std::string& name) {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}

std::string dump(const std::vector<DoctorCheck>& checks) {
  return format_checks(checks);
}

// The check named `name` (nullptr, a failure, when there is none), expected to have `status` and a detail
// that says `says`.
const DoctorCheck* expect_check(const std::vector<DoctorCheck>& checks, const std::string& name,
                                CheckStatus status, const std::string& says) {
  const DoctorCheck* c = find(checks, name);
  EXPECT_NE(c, nullptr) << "no check '" << name << "':\n" << dump(checks);
  if (!c) return nullptr;
  EXPECT_EQ(c->status, status) << name << ": " << c->detail;
  EXPECT_NE(c->detail.find(says), std::string::npos) << name << ": " << c->detail;
  return c;
}

TEST(Doctor, HealthySparkPasses) {
  FakeHost host;
  HostFacts f = host.probe();
  EXPECT_EQ(f.cpu_arch, "aarch64");
  EXPECT_EQ(f.binary_arch, "aarch64");
  EXPECT_DOUBLE_EQ(f.shm_size, 64.0 * 1024 * 1024 * 1024);
  ASSERT_EQ(f.gpus.size(), 1u);
  EXPECT_EQ(f.gpus[0].compute_capability, 121);
  EXPECT_LT(f.gpus[0].memory_total, 0);  // unified memory: nvidia-smi says N/A
  EXPECT_EQ(f.kernel_driver, "580.95.05");
  EXPECT_EQ(f.listening_ports, std::vector<int>{22});  // the 30000 row is an outgoing connection
  EXPECT_EQ(f.nofile_soft, 1048576);
  auto checks = check_host(f, host.options);
  for (const auto& c : checks) EXPECT_EQ(c.status, CheckStatus::Ok) << dump(checks);
  EXPECT_NE(find(checks, "gpu 0")->detail.find("sm_121, FP8 yes, NVFP4 yes"), std::string::npos)
      << dump(checks);
  EXPECT_NE(find(checks, "memory")->detail.find("unified memory"), std::string::npos);
}

TEST(Doctor, WrongArchitectureBinaryFails) {
  FakeHost host;
  write_elf(host.dir / "moeserve", 62);  // an x86_64 build on a Spark
  auto checks = host.run();
  auto c =
      expect_check(checks, "architecture", CheckStatus::Fail, "built for x86_64, but this CPU is aarch64");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->fix.find("Dockerfile.aarch64-sm121"), std::string::npos) << c->fix;
}

TEST(Doctor, ElfArchReadsRealBinaries) {
  EXPECT_FALSE(elf_arch(MOESERVE_BINARY).empty());
  EXPECT_EQ(elf_arch("tests/fixtures/models/tiny-moe/config.json"), "");
}

TEST(Doctor, SmallShmFails) {
  FakeHost host;
  host.file("proc/mounts", "shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0\n");
  auto checks = host.run();
  auto c = expect_check(checks, "shared memory", CheckStatus::Fail, "67.1 MB");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->detail.find("never answer"), std::string::npos);
  EXPECT_NE(c->fix.find("--ipc=host"), std::string::npos);
}

TEST(Doctor, NoGpuWarnsAboutTheCpuBackend) {
  FakeHost host;
  fs::remove(host.dir / "dev/nvidia0");
  fs::remove(host.dir / "dev/nvidiactl");
  host.options.nvidia_smi = host.dir / "not-installed";
  auto checks = host.run();
  auto c = find(checks, "gpu");
  ASSERT_NE(c, nullptr) << dump(checks);
  EXPECT_EQ(c->status, CheckStatus::Warn);
  // serve does not fall back to the CPU by itself: --device cuda fails; the CPU backend is serve's default.
  EXPECT_NE(
      c->detail.find("`moeserve serve --device cuda` (what plan writes for GPU nodes) cannot start here"),
      std::string::npos)
      << c->detail;
  EXPECT_NE(c->detail.find("--device cpu, serve's default"), std::string::npos) << c->detail;
  EXPECT_NE(c->fix.find("--gpus all"), std::string::npos);
  EXPECT_NE(c->fix.find("leave --device out"), std::string::npos) << c->fix;
  // This host's CUDA build can only run --device cpu; a CPU-only build is what such a host needs.
  auto build = find(checks, "cuda build");
  ASSERT_NE(build, nullptr) << dump(checks);
  EXPECT_EQ(build->status, CheckStatus::Info);
  EXPECT_NE(build->detail.find("built with CUDA for 121, but no GPU is visible"), std::string::npos);
  host.build = {};
  EXPECT_EQ(find(host.run(), "cuda build")->status, CheckStatus::Ok);
}

TEST(Doctor, CudaBuildForThisGpuPasses) {
  FakeHost host;
  host.build.cuda_archs = {"90a", "121"};  // CMake's default list
  auto checks = host.run();
  auto c = find(checks, "cuda build");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Ok) << c->detail;
  EXPECT_NE(c->detail.find("built with CUDA for 90a;121; kernels load on GPU 0 (NVIDIA GB10, sm_121)"),
            std::string::npos)
      << c->detail;
}

TEST(Doctor, CudaBuildForAnotherGpuFails) {
  FakeHost host;
  host.build.cuda_archs = {"90a"};  // the x86_64-sm90 image's kernels on a Spark
  auto checks = host.run();
  auto c = find(checks, "cuda build");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Fail);
  EXPECT_NE(
      c->detail.find("built with CUDA for 90a only: no kernel of it loads on GPU 0 (NVIDIA GB10, sm_121)"),
      std::string::npos)
      << c->detail;
  EXPECT_NE(c->fix.find("-DMOESERVE_CUDA_ARCHITECTURES=121"), std::string::npos) << c->fix;
  EXPECT_NE(c->fix.find("Dockerfile.aarch64-sm121"), std::string::npos) << c->fix;
  // SASS only for sm_120 runs on sm_121 (same major, older minor); sm_120 PTX would too.
  host.build.cuda_archs = {"120-real"};
  EXPECT_EQ(find(host.run(), "cuda build")->status, CheckStatus::Ok);
  // Only portable PTX of an older major: the driver compiles it at the first start.
  host.build.cuda_archs = {"90"};
  auto ptx_checks = host.run();
  auto ptx = find(ptx_checks, "cuda build");
  EXPECT_EQ(ptx->status, CheckStatus::Warn) << ptx->detail;
  EXPECT_NE(ptx->detail.find("runs only PTX"), std::string::npos) << ptx->detail;
  host.build.cuda_archs = {"90-real"};
  EXPECT_EQ(find(host.run(), "cuda build")->status, CheckStatus::Fail);
}

TEST(Doctor, CpuOnlyBuildOnAGpuHostFails) {
  FakeHost host;
  host.build = {};
  auto checks = host.run();
  auto c = expect_check(checks, "cuda build", CheckStatus::Fail,
                        "built without CUDA, but this host has an NVIDIA GPU");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->fix.find("-DMOESERVE_CUDA=ON"), std::string::npos);
}

TEST(Doctor, CudaBuildThatCannotBeComparedIsInfo) {
  FakeHost host;
  host.build.cuda_archs = {"native"};
  auto checks = host.run();
  auto c = expect_check(checks, "cuda build", CheckStatus::Info, "'native'");
  ASSERT_NE(c, nullptr);
  // A GPU without nvidia-smi: its compute capability is unknown.
  host.build.cuda_archs = {"121"};
  host.options.nvidia_smi = host.dir / "not-installed";
  auto checks_again = host.run();
  c = find(checks_again, "cuda build");
  EXPECT_EQ(c->status, CheckStatus::Info) << c->detail;
  EXPECT_NE(c->detail.find("compute capability is unknown"), std::string::npos) << c->detail;
}

// The real binary reports its own build: CI builds without CUDA.
TEST(Doctor, ThisBuildIsReported) {
  BuildInfo b = this_build();
  EXPECT_EQ(b.cuda, !b.cuda_archs.empty());
  EXPECT_EQ(probe_host(DoctorOptions{}).build.cuda, b.cuda);
}

TEST(Doctor, TensorParallelOnGpusSaysServeRefusesIt) {
  FakeHost host;
  host.options.tp = 2;
  auto checks = host.run();
  auto c =
      expect_check(checks, "tensor parallel", CheckStatus::Warn, "`serve --tp 2 --device cuda` is refused");
  ASSERT_NE(c, nullptr);
  host.options.tp = 1;
  EXPECT_EQ(find(host.run(), "tensor parallel"), nullptr);
}

TEST(Doctor, HiddenGpusWarn) {
  FakeHost host;
  host.options.cuda_visible_devices = "";
  auto checks = host.run();
  auto c = expect_check(checks, "gpu", CheckStatus::Warn, "CUDA_VISIBLE_DEVICES");
  ASSERT_NE(c, nullptr);
}

TEST(Doctor, OldDriverFails) {
  FakeHost host;
  host.smi("echo 'NVIDIA H200, 9.0, 143771, 0, 550.54.15'");
  host.file("proc/sys/kernel/arch", "x86_64\n");
  write_elf(host.dir / "moeserve", 62);
  auto checks = host.run();
  auto c = expect_check(checks, "driver", CheckStatus::Fail, "550.54.15 is older than 580");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(find(checks, "architecture")->status, CheckStatus::Ok);
}

TEST(Doctor, FailingNvidiaSmiFails) {
  FakeHost host;
  host.smi("echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18");
  auto checks = host.run();
  auto c = expect_check(checks, "gpu", CheckStatus::Fail, "Driver/library version mismatch");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->fix.find("reboot"), std::string::npos);
}

TEST(Doctor, BusyPortFails) {
  FakeHost host;
  host.file("proc/net/tcp6",
            "  sl  local_address                         remote_address                        st\n"
            "   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 0\n");
  auto checks = host.run();
  auto c = expect_check(checks, "port", CheckStatus::Fail, "port 30000 is already in use");
  ASSERT_NE(c, nullptr);
  host.options.port = 30001;
  auto again = host.run();
  EXPECT_EQ(find(again, "port")->status, CheckStatus::Ok);
}

TEST(Doctor, LowFileLimitWarns) {
  FakeHost host;
  host.limits(1024);
  auto checks = host.run();
  auto c = find(checks, "open files");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Warn);
  EXPECT_NE(c->fix.find("LimitNOFILE=1048576"), std::string::npos);
}

TEST(Doctor, MemoryPressureOnUnifiedMemoryWarns) {
  FakeHost host;
  host.meminfo(128e9, 10e9);
  auto checks = host.run();
  auto c = find(checks, "memory");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Warn);
  EXPECT_NE(c->fix.find("drop_caches"), std::string::npos);
}

TEST(Doctor, BusyDiscreteGpuWarns) {
  FakeHost host;
  host.file("proc/sys/kernel/arch", "x86_64\n");
  write_elf(host.dir / "moeserve", 62);
  host.smi("echo 'NVIDIA H200, 9.0, 143771, 40000, 580.65.06'");
  auto checks = host.run();
  auto c = expect_check(checks, "gpu 0 memory", CheckStatus::Warn, "41.9 GB of 150.8 GB already in use");
  ASSERT_NE(c, nullptr);
}

// ---- model directories
// ---------------------------------------------------------------------------------------

class FakeModel {
 public:
  FakeModel() { fs::copy("tests/fixtures/models/tiny-moe", dir.path(), fs::copy_options::recursive); }
  std::vector<DoctorCheck> run(FakeHost& host) const {
    return check_model(dir.path(), host.probe(), host.options);
  }
  TempDir dir;
};

TEST(DoctorModel, FixtureCheckpointPasses) {
  FakeHost host;
  FakeModel model;
  auto checks = model.run(host);
  for (const auto& c : checks) EXPECT_NE(c.status, CheckStatus::Fail) << dump(checks);
  EXPECT_NE(find(checks, "model shards")->detail.find("1 shard complete"), std::string::npos) << dump(checks);
  EXPECT_NE(find(checks, "context")->detail.find("finish_reason \"length\""), std::string::npos);
}

TEST(DoctorModel, TruncatedShardFails) {
  FakeHost host;
  FakeModel model;
  fs::resize_file(model.dir / "model.safetensors", 500000);
  auto checks = model.run(host);
  auto c = find(checks, "model shards");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Fail);
  EXPECT_NE(c->detail.find("model.safetensors (is 500.0 kB, its header describes 767.0 kB)"),
            std::string::npos)
      << c->detail;
  EXPECT_NE(c->fix.find("interrupted download"), std::string::npos);
}

TEST(DoctorModel, MissingShardFails) {
  FakeHost host;
  FakeModel model;
  fs::rename(model.dir / "model.safetensors", model.dir / "model-00001-of-00002.safetensors");
  write_file(
      model.dir / "model.safetensors.index.json",
      R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  auto checks = model.run(host);
  auto c = find(checks, "model shards");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Fail);
  EXPECT_NE(c->detail.find("1 of 2 shards missing or incomplete: model-00002-of-00002.safetensors"),
            std::string::npos)
      << c->detail;
}

TEST(DoctorModel, UnsupportedQuantizationFails) {
  FakeHost host;
  FakeModel model;
  auto cfg = nlohmann::json::parse(testing::read_file(model.dir / "config.json"));
  cfg["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}};
  write_file(model.dir / "config.json", cfg.dump());
  auto checks = model.run(host);
  auto c = find(checks, "model config");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Fail);
  EXPECT_NE(c->fix.find("CUDA error 700"), std::string::npos) << c->fix;
}

TEST(DoctorModel, UnsupportedTensorTypeFails) {
  FakeHost host;
  FakeModel model;
  std::string header = R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})";
  std::string file(8, '\0');
  uint64_t len = header.size();
  std::memcpy(file.data(), &len, 8);
  write_file(model.dir / "model.safetensors", file + header + "abcd");
  auto checks = model.run(host);
  auto c = expect_check(checks, "model dtype", CheckStatus::Fail, "U8");
  ASSERT_NE(c, nullptr);
}

TEST(DoctorModel, ContextBeyondTheModelFails) {
  FakeHost host;
  FakeModel model;
  host.options.max_model_len = 8192;  // the fixture's max_position_embeddings is 4096
  auto checks = model.run(host);
  auto c = find(checks, "context");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->status, CheckStatus::Fail);
  EXPECT_NE(c->fix.find("--max-model-len 4096"), std::string::npos);
}

TEST(DoctorModel, ModelThatDoesNotFitFails) {
  FakeHost host;
  FakeModel model;
  host.meminfo(1.024e9, 0.9e9);  // 1 GB at 0.85: less than the working memory alone
  auto checks = model.run(host);
  auto c = expect_check(checks, "model memory", CheckStatus::Fail, "does not fit");
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->detail.find("budget 870.4 MB (unified memory 1.0 GB x 0.85)"), std::string::npos) << c->detail;
}

// The command end to end on this machine: the binary matches this CPU; the JSON is well formed.
TEST(DoctorCommand, RunsOnThisHost) {
  auto r = run_command(std::string(MOESERVE_BINARY) +
                       " doctor --json --port 0 --model tests/fixtures/models/tiny-moe");
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('[')));
  bool arch_ok = false, model_ok = false;
  for (const auto& c : j) {
    if (c["name"] == "architecture") arch_ok = c["status"] == "ok";
    if (c["name"] == "model shards") model_ok = c["status"] == "ok";
  }
  EXPECT_TRUE(arch_ok) << r.output;
  EXPECT_TRUE(model_ok) << r.output;
  // Exit code 1 exactly when a check failed.
  bool failed = false;
  for (const auto& c : j) failed = failed || c["status"] == "FAIL";
  EXPECT_EQ(r.status, failed ? 1 : 0) << r.output;
}

}  // namespace
}  // namespace moeserve::deploy
