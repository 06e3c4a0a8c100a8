#include "deploy/doctor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "common/error.h"
#include "deploy/build_info.h"
#include "deploy/footprint.h"
#include "deploy/gpus.h"
#include "deploy/units.h"
#include "model/config.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string under(const DoctorOptions& o, const std::string& path) {
  return o.root == "/" ? path : (fs::path(o.root) / fs::path(path).relative_path()).string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(trim(cur));
  return out;
}

// "65536k" (tmpfs mount option) -> bytes.
double tmpfs_size(const std::string& v, double mem_total) {
  if (v.empty()) return -1;
  if (v.back() == '%') return mem_total > 0 ? mem_total * std::atof(v.c_str()) / 100 : -1;
  double n = std::atof(v.c_str());
  switch (v.back()) {
    case 'k':
    case 'K':
      return n * 1024;
    case 'm':
    case 'M':
      return n * 1024 * 1024;
    case 'g':
    case 'G':
      return n * 1024 * 1024 * 1024;
    default:
      return n;
  }
}

int64_t parse_limit(const std::string& v) {
  if (v == "unlimited") return INT64_MAX;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  return end == v.c_str() ? -1 : x;
}

std::string find_in_path(const std::string& cmd) {
  if (cmd.find('/') != std::string::npos) return ::access(cmd.c_str(), X_OK) == 0 ? cmd : "";
  const char* path = std::getenv("PATH");
  for (const auto& dir : split(path ? path : "/usr/bin:/bin", ':')) {
    std::string p = dir + "/" + cmd;
    if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

void read_nvidia_smi(const DoctorOptions& o, HostFacts& f) {
  std::string exe = find_in_path(o.nvidia_smi);
  if (exe.empty()) return;
  f.nvidia_smi_found = true;
  std::string cmd = shell_word(exe) +
                    " --query-gpu=name,compute_cap,memory.total,memory.used,driver_version"
                    " --format=csv,noheader,nounits 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    f.nvidia_smi_status = -1;
    f.nvidia_smi_error = "could not run " + exe;
    return;
  }
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  int status = ::pclose(p);
  f.nvidia_smi_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (f.nvidia_smi_status != 0) {
    f.nvidia_smi_error = trim(out);
    return;
  }
  auto mib = [](const std::string& v) {
    return v.empty() || v[0] == '[' ? -1.0 : std::atof(v.c_str()) * 1048576;
  };
  for (const auto& line : lines(out)) {
    auto cols = split(line, ',');
    if (cols.size() < 5 || cols[0].empty()) continue;
    GpuFact g;
    g.name = cols[0];
    if (!cols[1].empty() && cols[1][0] != '[') {
      try {
        g.compute_capability = parse_cuda_arch(cols[1]).capability;
      } catch (const Error&) {
      }
    }
    g.memory_total = mib(cols[2]);
    g.memory_used = mib(cols[3]);
    g.driver = cols[4];
    f.gpus.push_back(g);
  }
}

const GpuKind* kind_of(const GpuFact& g) {
  if (const GpuKind* k = find_gpu(g.name)) return k;
  for (const auto& k : gpu_kinds())
    if (k.compute_capability == g.compute_capability && g.compute_capability > 0) return &k;
  return nullptr;
}

int driver_major(const std::string& v) {
  return v.empty() ? -1 : std::atoi(v.c_str());
}

bool unified_memory(const HostFacts& f) {
  if (f.gpus.empty()) return true;  // the CPU backend serves from RAM
  for (const auto& g : f.gpus) {
    const GpuKind* k = kind_of(g);
    if ((k && k->unified_memory) || g.memory_total < 0) return true;
  }
  return false;
}

DoctorCheck ok(std::string name, std::string detail) {
  return {std::move(name), CheckStatus::Ok, std::move(detail), ""};
}

bool gpu_visible(const HostFacts& f) {
  return !f.gpus.empty() || !f.nvidia_devices.empty();
}

// Whether kernels compiled for one entry of CMake's CUDA_ARCHITECTURES load on a GPU of capability `gpu`.
// "NN" carries SASS for sm_NN and PTX for compute_NN, "NN-real" the SASS only, "NN-virtual" the PTX only;
// PTX is compiled by the driver for any newer GPU unless it is arch-specific (the 'a' suffix). Returns
// nullopt for entries that name no architecture ("native", "all", family suffixes).
std::optional<bool> cmake_arch_runs_on(const std::string& entry, int gpu) {
  std::string name = entry;
  bool sass = true, ptx = true;
  if (name.ends_with("-real")) name.resize(name.size() - 5), ptx = false;
  if (name.ends_with("-virtual")) name.resize(name.size() - 8), sass = false;
  CudaArch arch;
  try {
    arch = parse_cuda_arch(name);
  } catch (const Error&) {
    return std::nullopt;
  }
  bool by_sass = sass && cuda_arch_runs_on(arch, gpu);
  bool by_ptx = ptx && (arch.arch_specific ? arch.capability == gpu : arch.capability <= gpu);
  return by_sass || by_ptx;
}

// `serve --device cuda` needs the CUDA backend compiled in, with kernels this GPU can load.
DoctorCheck check_cuda_build(const HostFacts& f) {
  const std::string name = "cuda build";
  const std::string archs = fmt::format("{}", fmt::join(f.build.cuda_archs, ";"));
  const std::string dockerfile = f.cpu_arch == "aarch64" ? "deploy/docker/Dockerfile.aarch64-sm121"
                                                         : "deploy/docker/Dockerfile.x86_64-sm90";
  if (!f.build.cuda) {
    if (!gpu_visible(f))
      return ok(name, "this moeserve is a CPU-only build; with no GPU here the CPU backend is what serves");
    return {name, CheckStatus::Fail,
            "this moeserve was built without CUDA, but this host has an NVIDIA GPU: `serve --device cuda` "
            "stops with \"built without CUDA\", and --device cpu leaves the GPU idle",
            fmt::format("use the image for this host ({}) or rebuild with -DMOESERVE_CUDA=ON "
                        "-DMOESERVE_CUDA_ARCHITECTURES=<the GPU's, e.g. 121 for GB10, 90a for H100/H200>",
                        dockerfile)};
  }
  if (!gpu_visible(f))
    return {name, CheckStatus::Info,
            fmt::format("built with CUDA for {}, but no GPU is visible: only --device cpu works here", archs),
            ""};
  std::vector<std::string> loads, not_loads, by_ptx_only;
  bool known = false;
  int wanted = 0;  // the capability of a GPU the build misses
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    const GpuFact& g = f.gpus[i];
    if (g.compute_capability <= 0) continue;
    bool runs = false, unknown_entry = false, sass = false;
    for (const auto& entry : f.build.cuda_archs) {
      auto r = cmake_arch_runs_on(entry, g.compute_capability);
      if (!r) unknown_entry = true;
      runs = runs || r.value_or(false);
      if (r.value_or(false) && !entry.ends_with("-virtual")) {
        CudaArch a = parse_cuda_arch(entry.substr(0, entry.find('-')));
        sass = sass || cuda_arch_runs_on(a, g.compute_capability);
      }
    }
    if (unknown_entry && !runs)
      return {
          name, CheckStatus::Info,
          fmt::format("built with CUDA for '{}', which names no architecture doctor can compare with "
                      "GPU {} ({})",
                      archs, i, format_cuda_arch(g.compute_capability)),
          "build with explicit architectures (-DMOESERVE_CUDA_ARCHITECTURES=121 or 90a) to have it checked"};
    known = true;
    std::string label = fmt::format("GPU {} ({}, {})", i, g.name, format_cuda_arch(g.compute_capability));
    (runs ? loads : not_loads).push_back(label);
    if (!runs) wanted = g.compute_capability;
    if (runs && !sass) by_ptx_only.push_back(label);
  }
  if (!known)
    return {
        name, CheckStatus::Info,
        fmt::format("built with CUDA for {}; the GPU's compute capability is unknown (nvidia-smi is needed "
                    "to read it), so doctor cannot tell whether its kernels load",
                    archs),
        "install nvidia-smi (nvidia-utils) and run doctor again"};
  if (!not_loads.empty())
    return {
        name, CheckStatus::Fail,
        fmt::format("built with CUDA for {} only: no kernel of it loads on {} (`serve --device cuda` fails "
                    "with \"no kernel image is available for execution on the device\")",
                    archs, fmt::join(not_loads, ", ")),
        fmt::format("rebuild with -DMOESERVE_CUDA_ARCHITECTURES={} or use the image for this host ({})",
                    wanted == 90 ? std::string("90a") : std::to_string(wanted), dockerfile)};
  if (!by_ptx_only.empty())
    return {
        name, CheckStatus::Warn,
        fmt::format("built with CUDA for {}: {} runs only PTX the driver compiles at the first start "
                    "(minutes, and not tuned for it)",
                    archs, fmt::join(by_ptx_only, ", ")),
        fmt::format("rebuild with this GPU's architecture in -DMOESERVE_CUDA_ARCHITECTURES (the image for "
                    "this host: {})",
                    dockerfile)};
  return ok(name, fmt::format("built with CUDA for {}; kernels load on {}", archs, fmt::join(loads, ", ")));
}

// What serve does with --tp > 1 today: CPU ranks under mpirun only; --device cuda with --tp is refused.
DoctorCheck check_tensor_parallel(const HostFacts& f, int tp) {
  if (gpu_visible(f))
    return {"tensor parallel", CheckStatus::Warn,
            fmt::format("`serve --tp {} --device cuda` is refused (\"--tp {} runs on the CPU backend for "
                        "now\"): NCCL tensor parallelism is built into CUDA builds but not wired into serve "
                        "yet (docs/tp.md)",
                        tp, tp),
            fmt::format("serve a model that fits one GPU with --tp 1; or run the {} ranks on the CPU backend "
                        "under mpirun -np {}",
                        tp, tp)};
  return {"tensor parallel", CheckStatus::Info,
          fmt::format("--tp {} on the CPU backend runs one process per rank: mpirun -np {} moeserve serve "
                      "--tp {} ... (docs/tp.md)",
                      tp, tp, tp),
          ""};
}

}  // namespace

const char* status_name(CheckStatus s) {
  switch (s) {
    case CheckStatus::Ok:
      return "ok";
    case CheckStatus::Info:
      return "info";
    case CheckStatus::Warn:
      return "warn";
    case CheckStatus::Fail:
      return "FAIL";
  }
  return "?";
}

std::string elf_arch(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char h[20] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) return "";
  if (h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' || h[3] != 'F') return "";
  // e_machine at offset 18, in the byte order EI_DATA (h[5]) names: 1 little, 2 big endian.
  int machine = h[5] == 2 ? (h[18] << 8 | h[19]) : (h[19] << 8 | h[18]);
  switch (machine) {
    case 62:
      return "x86_64";
    case 183:
      return "aarch64";
    case 3:
      return "i386";
    case 40:
      return "arm";
    case 243:
      return "riscv64";
    case 21:
      return "ppc64";
    default:
      return fmt::format("elf-machine-{}", machine);
  }
}

HostFacts probe_host(const DoctorOptions& o) {
  HostFacts f;
  f.build = this_build();
  f.cpu_arch = trim(slurp(under(o, "/proc/sys/kernel/arch")));
  if (f.cpu_arch.empty() && o.root == "/") {
    utsname u{};
    if (::uname(&u) == 0) f.cpu_arch = u.machine;
  }
  if (!normalize_arch(f.cpu_arch).empty()) f.cpu_arch = normalize_arch(f.cpu_arch);
  f.binary_path = o.binary;
  f.binary_arch = elf_arch(o.binary);

  for (const auto& line : lines(slurp(under(o, "/proc/meminfo")))) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    double kb = std::atof(line.c_str() + colon + 1);
    if (line.starts_with("MemTotal:")) f.mem_total = kb * 1024;
    if (line.starts_with("MemAvailable:")) f.mem_available = kb * 1024;
  }
  std::string cg = trim(slurp(under(o, "/sys/fs/cgroup/memory.max")));
  if (!cg.empty() && cg != "max") f.cgroup_limit = std::atof(cg.c_str());

  bool shm_mounted = false;
  for (const auto& line : lines(slurp(under(o, "/proc/mounts")))) {
    std::istringstream in(line);
    std::string dev, mnt, type, opts;
    in >> dev >> mnt >> type >> opts;
    if (mnt != "/dev/shm") continue;
    shm_mounted = true;
    f.shm_size = -1;
    for (const auto& opt : split(opts, ','))
      if (opt.starts_with("size=")) f.shm_size = tmpfs_size(opt.substr(5), f.mem_total);
  }
  if (f.shm_size < 0 && o.root == "/") {
    struct statvfs st {};
    if (::statvfs("/dev/shm", &st) == 0) f.shm_size = double(st.f_blocks) * double(st.f_frsize);
  } else if (f.shm_size < 0 && shm_mounted && f.mem_total > 0) {
    f.shm_size = f.mem_total / 2;  // tmpfs without size=: half of RAM
  }

  std::error_code ec;
  for (const auto& e : fs::directory_iterator(under(o, "/dev"), ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with("nvidia")) f.nvidia_devices.push_back("/dev/" + name);
  }
  std::sort(f.nvidia_devices.begin(), f.nvidia_devices.end());
  std::string ver = slurp(under(o, "/proc/driver/nvidia/version"));
  if (auto at = ver.find("Kernel Module"); at != std::string::npos) {
    std::istringstream in(ver.substr(at + 13));
    in >> f.kernel_driver;
    if (f.kernel_driver == "for")
      in >> f.kernel_driver >> f.kernel_driver;  // "Kernel Module for aarch64 580.x"
  }
  read_nvidia_smi(o, f);

  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    auto rows = lines(slurp(under(o, table)));
    for (size_t i = 1; i < rows.size(); ++i) {
      std::istringstream in(rows[i]);
      std::string sl, local, remote, state;
      in >> sl >> local >> remote >> state;
      auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos)
        ports.insert(int(std::strtol(local.c_str() + colon + 1, nullptr, 16)));
    }
  }
  f.listening_ports.assign(ports.begin(), ports.end());

  for (const auto& line : lines(slurp(under(o, "/proc/self/limits")))) {
    auto cols_from = [&](size_t at) {
      std::istringstream in(line.substr(at));
      std::string soft, hard;
      in >> soft >> hard;
      return std::make_pair(parse_limit(soft), parse_limit(hard));
    };
    if (line.starts_with("Max open files")) std::tie(f.nofile_soft, f.nofile_hard) = cols_from(14);
    if (line.starts_with("Max locked memory")) f.memlock_soft = cols_from(17).first;
  }
  return f;
}

std::vector<DoctorCheck> check_host(const HostFacts& f, const DoctorOptions& o) {
  std::vector<DoctorCheck> out;

  // Binary vs CPU: an x86 build on a Spark dies at once ("exec format error" or "Illegal instruction").
  if (f.binary_arch.empty()) {
    out.push_back({"architecture", CheckStatus::Warn,
                   fmt::format("cannot read the ELF header of {}", f.binary_path),
                   "pass --binary with the moeserve binary to check"});
  } else if (!f.cpu_arch.empty() && f.binary_arch != f.cpu_arch) {
    out.push_back(
        {"architecture", CheckStatus::Fail,
         fmt::format("{} is built for {}, but this CPU is {}: it dies with 'exec format error' or "
                     "'Illegal instruction'",
                     f.binary_path, f.binary_arch, f.cpu_arch),
         fmt::format("use the {} build (image moeserve:{})", f.cpu_arch,
                     f.cpu_arch == "aarch64" ? "aarch64-sm121, deploy/docker/Dockerfile.aarch64-sm121"
                                             : "x86_64-sm90, deploy/docker/Dockerfile.x86_64-sm90")});
  } else {
    out.push_back(ok("architecture", fmt::format("binary and CPU are both {}", f.cpu_arch)));
  }

  // GPUs.
  const std::string& cvd = o.cuda_visible_devices;
  bool hidden = cvd == "" || cvd == "-1" || cvd == "none" || cvd == "NoDevFiles";
  if (hidden)
    out.push_back({"gpu", CheckStatus::Warn, fmt::format("CUDA_VISIBLE_DEVICES='{}' hides every GPU", cvd),
                   "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (0,1,...)"});
  if (f.nvidia_devices.empty() && !f.nvidia_smi_found) {
    out.push_back(
        {"gpu", CheckStatus::Warn,
         "no NVIDIA GPU is visible (no /dev/nvidia*, no nvidia-smi): `moeserve serve --device cuda` (what "
         "plan writes for GPU nodes) cannot start here; only the CPU backend (--device cpu, serve's "
         "default) can serve, correctly but far slower than a GPU",
         "to serve on a GPU: in a container, start it with --gpus all (the NVIDIA Container Toolkit on the "
         "host); on the host, install the NVIDIA driver 580+. To serve on this CPU: leave --device out "
         "(cluster.yaml: gpu: cpu)"});
  } else if (!f.nvidia_smi_found) {
    out.push_back({"gpu", CheckStatus::Info,
                   fmt::format("{} present, but nvidia-smi is not installed: GPU details unknown",
                               fmt::join(f.nvidia_devices, ", ")),
                   "install nvidia-smi (nvidia-utils) to let doctor read the GPUs"});
  } else if (f.nvidia_smi_status != 0) {
    out.push_back({"gpu", CheckStatus::Fail, fmt::format("nvidia-smi failed: {}", f.nvidia_smi_error),
                   "a driver/library version mismatch needs a reboot after a driver update; in a container, "
                   "start it with --gpus all"});
  } else if (f.gpus.empty()) {
    out.push_back({"gpu", CheckStatus::Fail, "nvidia-smi lists no GPU", "check `nvidia-smi -L` and dmesg"});
  } else {
    for (size_t i = 0; i < f.gpus.size(); ++i) {
      const GpuFact& g = f.gpus[i];
      const GpuKind* k = kind_of(g);
      std::string caps =
          fmt::format("{}, FP8 {}, NVFP4 {}", format_cuda_arch(g.compute_capability),
                      g.compute_capability >= 89 ? "yes" : "no", g.compute_capability >= 100 ? "yes" : "no");
      std::string mem = g.memory_total > 0 ? format_bytes(g.memory_total) : "unified memory";
      DoctorCheck c = ok(fmt::format("gpu {}", i), fmt::format("{} ({}; {})", g.name, caps, mem));
      if (k && !k->note.empty()) c.detail += ". " + k->note;
      if (!k) c.status = CheckStatus::Info, c.fix = "an unknown GPU: plan and doctor use its reported memory";
      out.push_back(c);
    }
  }

  out.push_back(check_cuda_build(f));
  if (o.tp > 1) out.push_back(check_tensor_parallel(f, o.tp));

  // Driver: CUDA 13 needs the R580 driver or newer.
  std::string driver = !f.gpus.empty() ? f.gpus.front().driver : f.kernel_driver;
  if (!driver.empty()) {
    if (driver_major(driver) < 580)
      out.push_back(
          {"driver", CheckStatus::Fail,
           fmt::format("NVIDIA driver {} is older than 580; moeserve's CUDA 13 build needs 580 or newer",
                       driver),
           "install driver 580+ (DGX Spark: apply the DGX OS updates), then reboot"});
    else
      out.push_back(ok("driver", fmt::format("NVIDIA driver {} (CUDA 13 needs >= 580)", driver)));
  }

  // Memory: on unified memory the OS, the page cache and every process share the pool with the model.
  if (f.mem_total > 0) {
    if (unified_memory(f)) {
      double used = 1 - f.mem_available / f.mem_total;
      DoctorCheck c =
          ok("memory", fmt::format("{}: {} available of {} ({:.0f}% in use)",
                                   f.gpus.empty() ? "system memory" : "unified memory",
                                   format_bytes(f.mem_available), format_bytes(f.mem_total), used * 100));
      if (used > o.mem_fraction) {
        c.status = CheckStatus::Warn;
        c.fix = fmt::format(
            "more than {:.0f}% is already in use, before the model loads: stop other servers; the "
            "page cache counts on unified memory (sync; echo 3 > /proc/sys/vm/drop_caches)",
            o.mem_fraction * 100);
      }
      out.push_back(c);
    } else {
      for (size_t i = 0; i < f.gpus.size(); ++i) {
        const GpuFact& g = f.gpus[i];
        if (g.memory_total <= 0 || g.memory_used < 0) continue;
        if (g.memory_used > 0.05 * g.memory_total)
          out.push_back({fmt::format("gpu {} memory", i), CheckStatus::Warn,
                         fmt::format("{} of {} already in use by other processes",
                                     format_bytes(g.memory_used), format_bytes(g.memory_total)),
                         "nvidia-smi lists them; stop them, or give the server less (--cache-memory-gb, "
                         "--mem-fraction)"});
        else
          out.push_back(ok(fmt::format("gpu {} memory", i),
                           fmt::format("{} free", format_bytes(g.memory_total - g.memory_used))));
      }
    }
    if (f.cgroup_limit > 0 && f.cgroup_limit < f.mem_total)
      out.push_back({"container memory", CheckStatus::Info,
                     fmt::format("this container may use {} of the host's {}", format_bytes(f.cgroup_limit),
                                 format_bytes(f.mem_total)),
                     unified_memory(f) ? "on unified memory the model lives inside this limit: raise docker "
                                         "--memory or drop it"
                                       : ""});
  }

  // /dev/shm: too small and the server starts but never answers (NCCL and worker IPC block or fail).
  if (f.shm_size >= 0) {
    const double gib = 1024.0 * 1024 * 1024;
    std::string fix =
        "docker run --ipc=host (or --shm-size 64g); on the host, remount: mount -o remount,size=64G "
        "/dev/shm";
    if (f.shm_size < 1 * gib)
      out.push_back(
          {"shared memory", CheckStatus::Fail,
           fmt::format("/dev/shm is {} (docker's default is 64 MB): the server can start and then never "
                       "answer, or NCCL fails with 'unhandled system error'",
                       format_bytes(f.shm_size)),
           fix});
    else if (f.shm_size < 8 * gib)
      out.push_back(
          {"shared memory", CheckStatus::Warn,
           fmt::format("/dev/shm is {}; tensor-parallel runs want several GB", format_bytes(f.shm_size)),
           fix});
    else
      out.push_back(ok("shared memory", fmt::format("/dev/shm is {}", format_bytes(f.shm_size))));
  }

  // Open files: every client connection and every upstream connection is a descriptor.
  if (f.nofile_soft >= 0) {
    if (f.nofile_soft < 65536)
      out.push_back(
          {"open files", CheckStatus::Warn,
           fmt::format("soft limit {} (hard {}): the server refuses connections near that many clients",
                       f.nofile_soft,
                       f.nofile_hard == INT64_MAX ? "unlimited" : std::to_string(f.nofile_hard)),
           "ulimit -n 1048576 (systemd: LimitNOFILE=1048576; docker: --ulimit nofile=1048576:1048576)"});
    else
      out.push_back(ok("open files", fmt::format("soft limit {}", f.nofile_soft == INT64_MAX
                                                                      ? std::string("unlimited")
                                                                      : std::to_string(f.nofile_soft))));
  }
  if (f.memlock_soft >= 0 && f.memlock_soft != INT64_MAX && o.tp > 1 && gpu_visible(f))
    out.push_back({"locked memory", CheckStatus::Warn,
                   fmt::format("memlock limit {}: NCCL over RDMA needs to pin buffers",
                               format_bytes(double(f.memlock_soft))),
                   "ulimit -l unlimited (systemd: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1)"});

  if (o.port > 0) {
    if (std::find(f.listening_ports.begin(), f.listening_ports.end(), o.port) != f.listening_ports.end())
      out.push_back(
          {"port", CheckStatus::Fail, fmt::format("port {} is already in use on this host", o.port),
           fmt::format("`ss -ltnp 'sport = :{}'` shows who holds it; stop it or serve on another --port",
                       o.port)});
    else
      out.push_back(ok("port", fmt::format("port {} is free", o.port)));
  }
  return out;
}

std::vector<DoctorCheck> check_model(const std::string& dir, const HostFacts& f, const DoctorOptions& o) {
  std::vector<DoctorCheck> out;
  ModelConfig cfg;
  try {
    cfg = ModelConfig::from_file((fs::path(dir) / "config.json").string());
    out.push_back(ok("model config", cfg.summary()));
  } catch (const Error& e) {
    std::string msg = e.what();
    std::string fix = "point --model at the checkpoint directory (the one holding config.json)";
    if (msg.find("quant_method") != std::string::npos)
      fix =
          "serve the BF16 or FP8 checkpoint (NVFP4 and other formats are not supported; on GB10 NVFP4 "
          "kernels "
          "not built for sm_121 fail with CUDA error 700)";
    out.push_back({"model config", CheckStatus::Fail, msg, fix});
    return out;
  }

  // Shards: listed by the index (or every *.safetensors), each present and as long as its header says.
  std::vector<std::string> shards;
  std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(index_path)) {
    try {
      auto index = json::parse(slurp(index_path));
      std::set<std::string> names;
      for (const auto& [tensor, file] : index.at("weight_map").items()) names.insert(file.get<std::string>());
      shards.assign(names.begin(), names.end());
    } catch (const std::exception& e) {
      out.push_back({"model shards", CheckStatus::Fail,
                     fmt::format("{} is unreadable: {}", index_path, e.what()),
                     "re-download the checkpoint"});
      return out;
    }
  } else {
    // reference.safetensors holds Hugging Face reference outputs for `moeserve verify`, not weights.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors" &&
          e.path().filename().string().find("reference") == std::string::npos)
        shards.push_back(e.path().filename().string());
    std::sort(shards.begin(), shards.end());
  }
  std::vector<std::string> missing, broken;
  std::set<std::string> dtypes;
  double weight_bytes = 0;
  for (const auto& name : shards) {
    std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    auto size = fs::file_size(path, ec);
    if (ec) {
      missing.push_back(name);
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    uint64_t header_len = 0;
    if (!in.read(reinterpret_cast<char*>(&header_len), 8) || header_len + 8 > size) {
      broken.push_back(fmt::format("{} ({}: header cut off)", name, format_bytes(double(size))));
      continue;
    }
    std::string header(header_len, '\0');
    in.read(header.data(), std::streamsize(header_len));
    try {
      auto h = json::parse(header);
      uint64_t end = 0;
      for (const auto& [tensor, t] : h.items()) {
        if (tensor == "__metadata__") continue;
        end = std::max<uint64_t>(end, t.at("data_offsets")[1].get<uint64_t>());
        dtypes.insert(t.at("dtype").get<std::string>());
      }
      if (8 + header_len + end != size)
        broken.push_back(fmt::format("{} (is {}, its header describes {})", name, format_bytes(double(size)),
                                     format_bytes(double(8 + header_len + end))));
      weight_bytes += double(end);
    } catch (const std::exception&) {
      broken.push_back(fmt::format("{} (header is not valid JSON)", name));
    }
  }
  if (shards.empty())
    out.push_back({"model shards", CheckStatus::Fail, fmt::format("no *.safetensors in {}", dir),
                   "download the weights next to config.json"});
  else if (!missing.empty() || !broken.empty())
    out.push_back({"model shards", CheckStatus::Fail,
                   fmt::format("{} of {} shards missing or incomplete: {}", missing.size() + broken.size(),
                               shards.size(), fmt::join(missing.empty() ? broken : missing, ", ")),
                   "an interrupted download: resume it (huggingface-cli download REPO --local-dir DIR)"});
  else
    out.push_back(ok("model shards", fmt::format("{} shard{} complete, {} of weights", shards.size(),
                                                 shards.size() == 1 ? "" : "s", format_bytes(weight_bytes))));

  static const std::set<std::string> supported = {"BF16", "F16", "F32", "F8_E4M3"};
  std::vector<std::string> unsupported;
  for (const auto& d : dtypes)
    if (!supported.count(d)) unsupported.push_back(d);
  if (!unsupported.empty())
    out.push_back({"model dtype", CheckStatus::Fail,
                   fmt::format("tensors of type {} are not supported (BF16, F16, F32 and FP8 E4M3 are)",
                               fmt::join(unsupported, ", ")),
                   "serve the BF16 or FP8 release of the model"});
  else if (!dtypes.empty()) {
    bool fp8 = dtypes.count("F8_E4M3") > 0;
    DoctorCheck c = ok("model dtype", fmt::format("{}", fmt::join(dtypes, ", ")));
    for (const auto& g : f.gpus)
      if (fp8 && g.compute_capability > 0 && g.compute_capability < 89) {
        c.status = CheckStatus::Fail;
        c.detail +=
            fmt::format("; {} ({}) has no FP8 tensor cores", g.name, format_cuda_arch(g.compute_capability));
        c.fix = "serve the BF16 checkpoint on this GPU";
      }
    out.push_back(c);
  }

  // Context: a request holds prompt + output within max_model_len; generation stops there (finish_reason
  // length).
  int64_t ctx = o.max_model_len > 0 ? o.max_model_len : std::min<int64_t>(32768, cfg.max_position_embeddings);
  if (ctx > cfg.max_position_embeddings)
    out.push_back({"context", CheckStatus::Fail,
                   fmt::format("--max-model-len {} exceeds the model's max_position_embeddings {}", ctx,
                               cfg.max_position_embeddings),
                   fmt::format("use --max-model-len {} or less", cfg.max_position_embeddings)});
  else
    out.push_back(
        {"context", CheckStatus::Info,
         fmt::format("max_model_len {} (model maximum {}): prompt + output of one request fit in it; a "
                     "generation that reaches it stops with finish_reason \"length\"",
                     ctx, cfg.max_position_embeddings),
         ""});

  // Memory at the cap, against this host: unified memory counts the whole pool; discrete GPUs their own.
  double memory = 0;
  std::string what;
  if (unified_memory(f)) {
    memory = f.mem_total;
    what = f.gpus.empty() ? "system memory" : "unified memory";
  } else {
    for (const auto& g : f.gpus)
      if (g.memory_total > 0) memory = memory == 0 ? g.memory_total : std::min(memory, g.memory_total);
    what = "GPU memory";
  }
  if (memory > 0) {
    FitQuery q;
    q.config = cfg;
    q.model_name = dir;
    q.precision.weights = cfg.fp8 || dtypes.count("F8_E4M3") ? "fp8" : "bf16";
    q.precision.kv = kv_precision(o.kv_cache_dtype, !f.gpus.empty(), "--kv-cache-dtype");
    q.tp = o.tp;
    q.context = ctx;
    q.concurrency = o.max_running_requests;
    q.memory = memory;
    q.mem_fraction = o.mem_fraction;
    FitResult r = check_fit(q);
    if (weight_bytes > 0) {  // the checkpoint's real size beats the estimate
      r.need += weight_bytes / o.tp - r.per_rank.weights;
      r.per_rank.weights = weight_bytes / o.tp;
      r.fits = r.need <= r.budget;
    }
    std::string detail =
        fmt::format("{} for {} x {} tokens, budget {} ({} {} x {})", r.breakdown(), o.max_running_requests,
                    ctx, format_bytes(r.budget), what, format_bytes(memory), o.mem_fraction);
    if (!r.fits)
      out.push_back({"model memory", CheckStatus::Fail, "does not fit: " + detail,
                     r.would_fit.empty() ? "use a machine with more memory or tensor parallelism"
                                         : fmt::format("would fit: {}", fmt::join(r.would_fit, "; or "))});
    else
      out.push_back(ok("model memory", "fits: " + detail));
  }
  return out;
}

std::string format_checks(const std::vector<DoctorCheck>& checks) {
  std::string out;
  int fails = 0, warns = 0;
  for (const auto& c : checks) {
    out += fmt::format("[{:<4}] {:<16} {}\n", status_name(c.status), c.name, c.detail);
    if (!c.fix.empty() && c.status != CheckStatus::Ok) out += fmt::format("{:<24}fix: {}\n", "", c.fix);
    fails += c.status == CheckStatus::Fail;
    warns += c.status == CheckStatus::Warn;
  }
  out += fmt::format("\n{} check{}: {} failed, {} warning{}\n", checks.size(), checks.size() == 1 ? "" : "s",
                     fails, warns, warns == 1 ? "" : "s");
  return out;
}

json checks_to_json(const std::vector<DoctorCheck>& checks) {
  json arr = json::array();
  for (const auto& c : checks)
    arr.push_back(
        {{"name", c.name}, {"status", status_name(c.status)}, {"detail", c.detail}, {"fix", c.fix}});
  return arr;
}

}  // namespace moeserve::deploy
