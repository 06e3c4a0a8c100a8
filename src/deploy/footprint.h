#pragma once
// How much memory one rank of a model server needs: weights (BF16 or block-FP8 the way Qwen3.5 FP8
// checkpoints store them), attention KV per token, Gated-DeltaNet state per sequence, and working memory; and
// whether that fits a node at its memory cap, with the nearest configurations that would fit when it does
// not.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace moeserve::deploy {

// Built-in configs of the published Qwen3.5 MoE sizes (docs/qwen35-model.md §1), for planning on a machine
// that has no copy of the checkpoint. Names: qwen3.5-35b-a3b, qwen3.5-122b-a10b, qwen3.5-397b-a17b.
std::optional<ModelConfig> model_preset(const std::string& name);
std::string known_model_presets();

// One kind of tensor in the checkpoint, `count` times (e.g. one per expert per layer).
struct TensorGroup {
  std::string name;  // a representative checkpoint name ("layers.N.mlp.experts.E.up_proj.weight")
  int64_t rows = 0, cols = 1;
  int64_t count = 0;
  bool projection = false;  // a 2-D linear weight: stored in FP8 with block scales in an FP8 checkpoint
  enum class Split { ByTp, KvHeads, Replicated } split = Split::ByTp;
};
std::vector<TensorGroup> tensor_inventory(const ModelConfig& config);

struct Precision {
  std::string weights = "bf16";  // bf16 | fp8
  std::string kv = "bf16";       // fp32 | bf16 | fp8 (what serve's --kv-cache-dtype stores)
  std::string state = "fp32";    // fp32 | bf16 (the GDN recurrent state)
};
void validate_precision(const Precision& p, const std::string& where);  // throws with the allowed values
// Precision::kv for a --kv-cache-dtype spelling (auto, float32/fp32, bfloat16/bf16, fp8/fp8_e4m3): auto is
// what serve picks, bf16 with a GPU and fp32 without; anything else throws.
std::string kv_precision(const std::string& kv_cache_dtype, bool gpu, const std::string& where);

// One rank's bytes of every tensor of a group as the checkpoint stores them: FP8 projections with their
// float32 block scales (but the tensors FP8 releases keep in BF16), everything else BF16; split by TP.
double rank_bytes(const TensorGroup& group, const ModelConfig& config, const Precision& precision, int tp);
// Bytes per stored value of a Precision dtype: fp8 1, bf16 2, fp32 4.
double bytes_of(const std::string& dtype);

struct Footprint {          // per rank
  double weights = 0;       // bytes
  double kv_per_token = 0;  // bytes per token of context
  double state_per_sequence = 0;
  double workspace = 0;  // CUDA context, library workspaces, activations of one prefill chunk, logits
};
Footprint footprint(const ModelConfig& config, const Precision& precision, int tp, int prefill_chunk,
                    int max_running);

struct FitQuery {
  ModelConfig config;
  std::string model_name;  // for messages
  Precision precision;
  int tp = 1;
  int64_t context = 32768;  // tokens per sequence (max_model_len)
  int concurrency = 16;     // sequences resident at once (max_running_requests)
  double memory = 0;        // bytes per GPU (unified: the whole system memory)
  double mem_fraction = 0.85;
  int prefill_chunk = 8192;
};

struct FitResult {
  bool fits = false;
  double budget = 0, need = 0;
  Footprint per_rank;
  double kv_total = 0, state_total = 0;
  int64_t max_concurrency = 0;         // at the requested context (0: not even one sequence)
  int64_t max_context = 0;             // at the requested concurrency
  std::vector<std::string> would_fit;  // alternatives that fit, best first
  std::string breakdown() const;       // "weights 35.8 GB + KV 10.7 GB (16 x 32768 tokens) + ..."
};
FitResult check_fit(const FitQuery& query);

}  // namespace moeserve::deploy
