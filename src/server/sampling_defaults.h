#pragma once
// A model's preferred sampling from its generation_config.json, applied to what a request leaves unset, as
// vLLM (--generation-config auto) and SGLang do: Qwen3.5 ships temperature 0.6, top_p 0.95, top_k 20, and a
// client that sends none of them gets those rather than temperature 1.

#include <optional>
#include <string>

#include "server/openai_request.h"

namespace moeserve::server {

struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;

  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
  void apply(SamplingSettings& s) const;
  std::string summary() const;  // "temperature=0.6 top_p=0.95 top_k=20", for the log

  // Reads DIR/generation_config.json; no file or no sampling fields give empty defaults. Throws
  // moeserve::Error naming the file and field when a value is malformed or out of range.
  static SamplingDefaults load(const std::string& model_dir);
};

}  // namespace moeserve::server
