// moeserve generate: one prompt through a model, greedy; prints the generated ids and the speed (stderr).
// With --speculative-algorithm MTP it runs through the engine with MTP drafts (engine/speculative.h).
// With --preset (random weights of a preset's shape, made in memory) it measures any size without a
// checkpoint.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>

#include "backend/backend.h"
#include "command.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/speculative.h"
#include "model/checkpoint.h"
#include "model/init_model.h"
#include "model/sequence.h"
#include "shared_flags.h"

namespace moeserve::app {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    char* rest = nullptr;
    long v = std::strtol(item.c_str(), &rest, 10);
    check(!item.empty() && rest && *rest == '\0' && v >= 0 && v <= INT32_MAX,
          "--prompt-ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(int32_t(v));
    pos = end + 1;
  }
  check(!ids.empty(), "--prompt-ids is empty");
  return ids;
}

struct Options {
  std::string model;
  std::string preset;
  int layers = 0;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  std::string prompt_ids;
  int prompt_len = 0;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::string device = "cpu";
  std::string matmul = "bf16";
  std::string kv_cache_dtype = "auto";
  SpeculativeFlags speculative;
};

ModelWeights load_weights(const Options& o) {
  if (o.preset.empty()) {
    check(o.layers == 0, "--layers needs --preset (a checkpoint keeps its own layer count)");
    return load_checkpoint(o.model);
  }
  DType dtype = o.dtype == "fp8" ? DType::F8_E4M3 : DType::BF16;
  ModelConfig config = preset_config(o.preset, o.layers);
  if (speculative_steps(o.speculative) > 0) config.mtp_num_layers = std::max(config.mtp_num_layers, 1);
  return make_dummy_weights(config, o.seed, dtype);
}

// With speculative decoding: the prompt through the engine (one request), which drafts with the MTP layer
// and verifies; the same greedy tokens as without, plus how many drafts were accepted.
int run_speculative(const Options& o, const ModelWeights& weights, Backend& backend,
                    const std::vector<int32_t>& prompt, int steps) {
  EngineOptions eo;
  eo.backend = &backend;
  eo.max_running_requests = 1;
  eo.snapshot_slots = 0;
  eo.max_model_len = int64_t(prompt.size()) + o.max_tokens;
  eo.speculative_num_steps = steps;
  eo.kv_cache_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  auto engine = Engine::create(weights, eo);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = o.max_tokens;
  p.ignore_eos = o.ignore_eos;
  auto stream = std::make_shared<OutputStream>();
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  engine->submit({.id = "generate", .prompt = prompt, .params = p, .on_output = stream->sink()});
  GenerateOutput out = stream->collect();
  const double s = std::chrono::duration<double>(clock::now() - t0).count();
  check(out.finish_reason != FinishReason::Error, "generation failed: {}", out.error);
  std::printf("%s\n", fmt::format("{}", fmt::join(out.tokens, ",")).c_str());
  const EngineStats st = engine->stats();
  std::fprintf(
      stderr, "%s\n",
      fmt::format("{} prompt + {} generated tokens in {:.3f}s ({:.1f} tok/s overall); MTP: {} verify steps, "
                  "{} of {} drafts accepted, mean acceptance length {:.2f}",
                  prompt.size(), out.tokens.size(), s, double(out.tokens.size()) / s, st.spec_drafts,
                  st.spec_accepted_tokens, st.spec_draft_tokens,
                  st.spec_drafts ? 1.0 + double(st.spec_accepted_tokens) / double(st.spec_drafts) : 0.0)
          .c_str());
  return 0;
}

std::vector<int32_t> make_prompt(const Options& o, int64_t vocab) {
  if (!o.prompt_ids.empty()) return parse_ids(o.prompt_ids);
  std::vector<int32_t> ids(size_t(o.prompt_len));  // distinct-looking ids, the same every run
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((1 + i * 7919) % uint64_t(vocab));
  return ids;
}

int run(const Options& o) {
  auto weights = load_weights(o);
  auto backend = make_backend(o.device, {.fp32_matmul = o.matmul == "fp32"});
  Qwen35Model model(weights, *backend);
  auto prompt = make_prompt(o, model.config().vocab_size);
  for (int32_t id : prompt)
    check(id < model.config().vocab_size, "--prompt-ids: token {} is outside the vocabulary (size {})", id,
          model.config().vocab_size);
  if (int steps = speculative_steps(o.speculative); steps > 0)
    return run_speculative(o, weights, *backend, prompt, steps);
  const DType kv = resolve_kv_cache_dtype(parse_kv_cache_dtype(o.kv_cache_dtype), backend->cache_memory());
  SequenceRunner runner(model, int64_t(prompt.size()) + o.max_tokens, 16, kv);

  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  std::vector<int32_t> out;
  std::vector<float> logits = runner.prefill(prompt).logits;
  auto t1 = clock::now();
  const auto& eos = model.config().eos_token_ids;
  for (int i = 0; i < o.max_tokens; ++i) {
    int32_t next = argmax(logits);
    out.push_back(next);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), int64_t(next)) != eos.end()) break;
    if (i + 1 < o.max_tokens) logits = runner.decode(next);
  }
  auto t2 = clock::now();
  std::printf("%s\n", fmt::format("{}", fmt::join(out, ",")).c_str());
  double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(
      stderr, "%s\n",
      fmt::format("prefill {} tokens in {:.3f}s ({:.1f} tok/s); decode {} tokens in {:.3f}s ({:.1f} tok/s)",
                  prompt.size(), prefill_s, double(prompt.size()) / prefill_s, out.size() - 1, decode_s,
                  out.size() > 1 ? double(out.size() - 1) / decode_s : 0.0)
          .c_str());
  return 0;
}

Registration reg{
    {"generate", "Generate from a prompt of token ids (greedy) and print the ids", 50, [](CLI::App& cmd) {
       auto o = std::make_shared<Options>();
       auto model = cmd.add_option("--model", o->model, "checkpoint directory");
       auto preset = cmd.add_option("--preset", o->preset,
                                    "random weights of a preset's shape instead of a checkpoint "
                                    "(tiny, 35b-a3b, 122b-a10b, ...)");
       model->excludes(preset);
       cmd.add_option("--layers", o->layers, "with --preset: keep the first N layers")
           ->check(CLI::Range(1, 1000));
       cmd.add_option("--dtype", o->dtype, "with --preset: weight dtype")
           ->check(CLI::IsMember({"bf16", "fp8"}))
           ->capture_default_str();
       cmd.add_option("--seed", o->seed, "with --preset: seed of the random weights");
       auto ids = cmd.add_option("--prompt-ids", o->prompt_ids, "comma-separated token ids");
       auto len = cmd.add_option("--prompt-len", o->prompt_len, "a synthetic prompt of N tokens")
                      ->check(CLI::Range(1, 1 << 20));
       ids->excludes(len);
       cmd.add_option("--max-tokens", o->max_tokens, "tokens to generate")
           ->check(CLI::Range(1, 1 << 20))
           ->capture_default_str();
       add_kv_cache_dtype_flag(cmd, o->kv_cache_dtype, "bfloat16 on cuda, float32 on cpu");
       cmd.add_flag("--ignore-eos", o->ignore_eos, "keep generating after an end-of-sequence token");
       cmd.add_option("--device", o->device, "backend: cpu or cuda")
           ->check(CLI::IsMember({"cpu", "cuda"}))
           ->capture_default_str();
       cmd.add_option("--matmul", o->matmul, "CUDA matmul precision for prompts: bf16 (tensor cores) or fp32")
           ->check(CLI::IsMember({"fp32", "bf16"}))
           ->capture_default_str();
       add_speculative_flags(
           cmd, o->speculative,
           "MTP or NEXTN: draft with the checkpoint's MTP layer (same tokens, fewer steps)");
       return [o, model, preset, ids, len] {
         check(model->count() + preset->count() == 1, "give --model DIR or --preset NAME");
         check(ids->count() + len->count() == 1, "give --prompt-ids or --prompt-len");
         return run(*o);
       };
     }}};

}  // namespace
}  // namespace moeserve::app
