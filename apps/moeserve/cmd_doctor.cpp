// moeserve doctor [--model DIR] [--port N]: checks this host (and a model directory) for what breaks serving
// — wrong-architecture binary, no GPU, old driver, small /dev/shm, low file limits, busy port, incomplete
// checkpoint, a model that does not fit — and prints the fix for each. Exit code 1 when a check fails.
#include <cstdio>
#include <cstdlib>

#include "command.h"
#include "deploy/doctor.h"
#include "shared_flags.h"

namespace {

std::function<int()> setup(CLI::App& app) {
  auto opt = std::make_shared<moeserve::deploy::DoctorOptions>();
  auto json_out = std::make_shared<bool>(false);
  app.add_option("--model", opt->model_dir, "checkpoint directory to check (config, shards, dtype, memory)");
  app.add_option("--port", opt->port, "port the server will listen on (0 skips the check)")
      ->capture_default_str();
  app.add_option("--max-model-len", opt->max_model_len, "context length to check memory for (default 32768)");
  app.add_option("--max-running-requests", opt->max_running_requests,
                 "concurrent sequences to check memory for")
      ->capture_default_str();
  app.add_option("--mem-fraction-static", opt->mem_fraction,
                 "share of the whole memory for weights, KV cache and state (cluster.yaml mem_fraction)")
      ->capture_default_str();
  app.add_option("--tp", opt->tp, "tensor-parallel size the model will run with")->capture_default_str();
  moeserve::app::add_kv_cache_dtype_flag(app, opt->kv_cache_dtype,
                                         "what serve stores: bfloat16 with a GPU, float32 without");
  app.add_flag("--json", *json_out, "print the checks as JSON");
  // For checking another binary (an image's, copied out) or a captured host (tests).
  app.add_option("--binary", opt->binary, "binary whose architecture must match this CPU")->group("Advanced");
  app.add_option("--root", opt->root, "read proc/, sys/ and dev/ under this directory")->group("Advanced");
  app.add_option("--nvidia-smi", opt->nvidia_smi, "nvidia-smi command")->group("Advanced");
  return [opt, json_out]() -> int {
    using namespace moeserve::deploy;
    DoctorOptions o = *opt;
    const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
    if (cvd) o.cuda_visible_devices = cvd;
    HostFacts facts = probe_host(o);
    auto checks = check_host(facts, o);
    if (!o.model_dir.empty()) {
      auto model = check_model(o.model_dir, facts, o);
      checks.insert(checks.end(), model.begin(), model.end());
    }
    if (*json_out)
      std::printf("%s\n", checks_to_json(checks).dump(2).c_str());
    else
      std::fputs(format_checks(checks).c_str(), stdout);
    for (const auto& c : checks)
      if (c.status == CheckStatus::Fail) return 1;
    return 0;
  };
}

moeserve::app::Registration reg{{"doctor", "Check this host and a model directory; print fixes", 42, setup}};

}  // namespace
