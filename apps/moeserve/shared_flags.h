#pragma once
// Flags that several commands declare, in one place so that their spellings and checks agree.
// (`serve` declares --kv-cache-dtype itself: it also maps the aliases and refuses fp8_e5m2 by name.)

#include <CLI/CLI.hpp>
#include <string>

#include "engine/speculative.h"

namespace moeserve::app {

// --kv-cache-dtype for generate, verify and doctor; auto_means says what auto picks for that command.
inline CLI::Option* add_kv_cache_dtype_flag(CLI::App& cmd, std::string& value,
                                            const std::string& auto_means) {
  return cmd
      .add_option("--kv-cache-dtype", value,
                  "KV cache elements: auto (" + auto_means +
                      "), float32, bfloat16 or fp8_e4m3 (also fp32, bf16, fp8)")
      ->check(CLI::IsMember({"auto", "float32", "fp32", "bfloat16", "bf16", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
}

// SGLang's --speculative-* flags (speculative_steps() checks them together), for generate and serve.
inline void add_speculative_flags(CLI::App& cmd, SpeculativeFlags& flags, const std::string& algorithm_help) {
  cmd.add_option("--speculative-algorithm", flags.algorithm, algorithm_help);
  cmd.add_option("--speculative-num-steps", flags.num_steps, "drafts per step (default 3)");
  cmd.add_option("--speculative-eagle-topk", flags.eagle_topk, "1 (a chain of drafts)");
  cmd.add_option("--speculative-num-draft-tokens", flags.num_draft_tokens,
                 "num-steps + 1 (SGLang's spelling of the same)");
}

}  // namespace moeserve::app
