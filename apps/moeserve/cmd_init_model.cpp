// moeserve init-model: writes a random-weight Qwen3.5 checkpoint of the real layout (the demo model, and
// full-size shapes for benchmarks).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.h"
#include "common/error.h"
#include "model/init_model.h"

namespace {

struct Options {
  std::string preset;
  std::string out;
  int layers = 0;
  std::string dtype = "bf16";
  double max_shard_gb = 5.0;
  moeserve::InitModelOptions init;
};

std::function<int()> setup(CLI::App& sub) {
  auto o = std::make_shared<Options>();
  sub.add_option("--preset", o->preset,
                 fmt::format("model shape: {}", fmt::join(moeserve::preset_names(), "|")))
      ->required();
  sub.add_option("--out", o->out, "directory to write (config.json, generation_config.json, safetensors)")
      ->required();
  sub.add_option("--vocab-from", o->init.vocab_from,
                 "tokenizer.json: take its vocabulary size and eos ids, and copy the tokenizer files along");
  sub.add_option("--chat-template", o->init.chat_template,
                 "a chat template to copy in as chat_template.jinja");
  sub.add_flag("--vision", o->init.vision,
               "also write a random vision tower of the real layout (a Qwen3_5MoeForConditionalGeneration "
               "checkpoint)");
  sub.add_option("--seed", o->init.seed, "random seed (same seed, same bytes)")->capture_default_str();
  sub.add_option("--layers", o->layers, "keep only the first N layers of the preset");
  sub.add_option("--dtype", o->dtype, "bf16|fp8 (FP8 E4M3 with 128x128 block scales)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  sub.add_option("--max-shard-size", o->max_shard_gb, "shard the safetensors past this many GB")
      ->capture_default_str();
  return [o] {
    moeserve::check(o->max_shard_gb > 0, "--max-shard-size must be positive");
    o->init.dtype = o->dtype == "fp8" ? moeserve::DType::F8_E4M3 : moeserve::DType::BF16;
    o->init.max_shard_bytes = size_t(o->max_shard_gb * 1e9);
    auto config = moeserve::init_model(moeserve::preset_config(o->preset, o->layers), o->out, o->init);
    fmt::print("{}: {}\n", o->out, config.summary());
    return 0;
  };
}

moeserve::app::Registration reg{
    {"init-model", "Write a random-weight Qwen3.5 checkpoint of the real layout", 80, setup}};

}  // namespace
