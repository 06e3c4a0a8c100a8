// moeserve verify: the forward pass against Hugging Face reference outputs; exits non-zero on a mismatch.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "backend/backend.h"
#include "command.h"
#include "dist/communicator.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "model/verify.h"
#include "shared_flags.h"
#include "vision/verify_vision.h"

namespace moeserve::app {
namespace {

struct Options {
  std::string model;
  std::string reference;
  double tolerance = -1;  // < 0: the mode's default (kTolerance, kBf16Tolerance)
  bool layers = false;
  std::string rope_inv_freq = "auto";
  std::string device = "cpu";
  std::string matmul = "fp32";
  std::string kv_cache_dtype = "auto";
  int tp = 1;
  int64_t chunk = 16;
};

// The float32 paths meet the CPU's bound; bf16 tensor cores (the serving precision) are held relative to the
// largest reference value, 2% as the CUDA fixture tests do (docs/cuda.md).
constexpr double kTolerance = 1e-3, kBf16Tolerance = 2e-2;
bool relative_tolerance(const Options& o) {
  return o.device == "cuda" && o.matmul == "bf16";
}
double tolerance(const Options& o) {
  return o.tolerance >= 0 ? o.tolerance : relative_tolerance(o) ? kBf16Tolerance : kTolerance;
}

// A vision reference (docs/vision.md): every stage of the image path, one line each.
int run_vision(const Options& o, const Checkpoint& checkpoint, const TensorSet& reference) {
  check(o.tp == 1, "a vision reference is verified on one rank (--tp 1)");
  auto backend = make_backend(o.device, {.fp32_matmul = o.matmul == "fp32"});
  Qwen35Model model(checkpoint.weights, *backend);
  auto vision_config = VisionConfig::from_dir(o.model);
  check(vision_config.has_value(), "{}: a vision reference needs a checkpoint with a vision_config", o.model);
  auto vision = load_vision_weights(checkpoint.tensors, *vision_config);
  std::string dir = o.reference.empty() ? o.model : std::filesystem::path(o.reference).parent_path().string();
  // bf16 tensor cores round relatively: each stage's tolerance scales with its largest reference value.
  auto report = verify_vision_reference(model, vision, ImageProcessorConfig::from_dir(o.model), dir,
                                        reference, tolerance(o), o.chunk, relative_tolerance(o));
  std::printf("%s, vision tower %d blocks\n", checkpoint.weights.config.summary().c_str(),
              vision_config->depth);
  for (const auto& c : report.checks)
    std::printf("%s\n", fmt::format("{:<40} max|Δ| {:.3e}  (≤ {:.1e})  {}", c.name, c.max_abs_error,
                                    c.tolerance, c.ok ? "ok" : "FAIL")
                            .c_str());
  std::printf("%s\n", report.passed ? "PASS" : "FAIL");
  return report.passed ? 0 : 1;
}

int run(const Options& o) {
  auto checkpoint = open_checkpoint(o.model);
  auto reference =
      TensorSet::open_file(o.reference.empty() ? o.model + "/reference.safetensors" : o.reference);
  // The vision reference ran the checkpoint as from_pretrained loads it: float32 rotary buffers.
  if (is_vision_reference(reference)) {
    checkpoint.weights.config.rope_bf16_inv_freq = o.rope_inv_freq == "bf16";
    return run_vision(o, checkpoint, reference);
  }
  auto weights = std::move(checkpoint.weights);
  // HF casts the rotary buffer along with the weights: a bf16 checkpoint's reference ran with bf16-rounded
  // inverse frequencies, an FP8 one (dequantized to float32) with float32 ones.
  const auto& config = weights.config;
  weights.config.rope_bf16_inv_freq =
      o.rope_inv_freq == "bf16" || (o.rope_inv_freq == "auto" && config.dtype == "bfloat16" && !config.fp8);
  auto backend = make_backend(o.device, {.fp32_matmul = o.matmul == "fp32"});
  // --tp N: every rank runs the same cases on its shard of the weights (docs/tp.md); rank 0 prints.
  auto comm = dist::open_group({.tp = o.tp, .device = o.device});
  if (o.tp > 1) weights = shard_weights(weights, comm->rank(), comm->size());
  Qwen35Model model(weights, *backend, comm.get());
  // auto follows the check: the exact one (--matmul fp32) keeps float32 pages, as the references do; the
  // serving numerics (bf16) take the serving default (bf16 pages on a GPU).
  const DType kv =
      o.kv_cache_dtype == "auto" && o.matmul == "fp32"
          ? DType::F32
          : resolve_kv_cache_dtype(parse_kv_cache_dtype(o.kv_cache_dtype), backend->cache_memory());
  const VerifyOptions options{tolerance(o), o.layers, kv, relative_tolerance(o)};
  auto report = verify_against_reference(model, reference, options);
  // A checkpoint with an MTP layer and its reference beside it: the MTP cases follow, in the same report.
  const std::string mtp_reference = o.model + "/mtp_reference.safetensors";
  if (model.has_mtp() && o.tp == 1 && std::filesystem::exists(mtp_reference)) {
    auto mtp = verify_mtp_against_reference(model, TensorSet::open_file(mtp_reference), options);
    report.cases.insert(report.cases.end(), mtp.cases.begin(), mtp.cases.end());
    report.passed = report.passed && mtp.passed;
  }
  if (comm->rank() != 0) return report.passed ? 0 : 1;

  std::printf("%s%s, KV cache %s\n", weights.config.summary().c_str(),
              o.tp > 1 ? fmt::format(", tensor-parallel over {}", comm->describe()).c_str() : "",
              std::string(kv_cache_dtype_name(kv)).c_str());
  for (const auto& c : report.cases) {
    bool ok = c.max_abs_error <= c.tolerance && c.tokens_match;
    std::string tokens = c.generated_tokens == 0 ? ""
                         : c.tokens_match
                             ? fmt::format(", {} greedy tokens match", c.generated_tokens)
                             : fmt::format(", greedy tokens differ at {} of {} steps (first: step {})",
                                           c.token_mismatches, c.generated_tokens, c.first_mismatch);
    std::printf("%s\n", fmt::format("{:<8} {:>4} prompt tokens  max|Δlogit| {:.3e} (≤ {:.1e}){}  {}", c.name,
                                    c.prompt_tokens, c.max_abs_error, c.tolerance, tokens, ok ? "ok" : "FAIL")
                            .c_str());
  }
  for (const auto& l : report.layers)
    std::printf("%s\n", fmt::format("  {:<28} max|Δ| {:.3e}", l.name, l.max_abs_error).c_str());
  if (!report.first_divergent_layer.empty())
    std::printf("first layer beyond tolerance: %s\n", report.first_divergent_layer.c_str());
  std::printf("%s\n", report.passed ? "PASS" : "FAIL");
  return report.passed ? 0 : 1;
}

Registration reg{
    {"verify", "Check logits and greedy tokens against Hugging Face reference outputs", 51,
     [](CLI::App& cmd) {
       auto o = std::make_shared<Options>();
       cmd.add_option("--model", o->model, "checkpoint directory")->required();
       cmd.add_option("--reference", o->reference, "reference file (default MODEL/reference.safetensors)");
       cmd.add_option("--tolerance", o->tolerance,
                      "max |Δlogit| (default 1e-3; with --device cuda --matmul bf16, 2e-2 of the "
                      "largest reference logit)");
       cmd.add_option("--tp", o->tp, "tensor-parallel ranks (run under mpirun -np N)")
           ->check(CLI::PositiveNumber)
           ->capture_default_str();
       add_kv_cache_dtype_flag(cmd, o->kv_cache_dtype, "float32 with --matmul fp32, else bfloat16 on cuda");
       cmd.add_flag("--layers", o->layers, "compare prompt0.hidden_states layer by layer");
       cmd.add_option("--chunk", o->chunk, "vision references: prefill chunk that splits an image")
           ->check(CLI::PositiveNumber)
           ->capture_default_str();
       cmd.add_option("--device", o->device, "backend: cpu or cuda")
           ->check(CLI::IsMember({"cpu", "cuda"}))
           ->capture_default_str();
       // The references are float32; bf16 tensor-core matmuls (the serving default) are held
       // to a looser tolerance relative to each case's (a vision stage's) largest value.
       cmd.add_option("--matmul", o->matmul, "CUDA matmul precision: fp32 or bf16 (tensor cores)")
           ->check(CLI::IsMember({"fp32", "bf16"}))
           ->capture_default_str();
       // The fixtures' references ran with the rotary inverse frequencies rounded to bf16 (HF
       // casts buffers with the weights); serving uses float32.
       cmd.add_option("--rope-inv-freq", o->rope_inv_freq,
                      "precision of RoPE inverse frequencies the reference used")
           ->check(CLI::IsMember({"auto", "bf16", "f32"}))
           ->capture_default_str();
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace moeserve::app
