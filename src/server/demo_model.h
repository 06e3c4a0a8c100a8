#pragma once
// Where `moeserve serve --model demo` finds the real Qwen3 vocabulary it pairs with random weights: the
// tokenizer scripts/fetch-test-data.sh fetches into .cache/tokenizer-qwen3 of the source tree. Found from any
// working directory, so the binary works outside the repository root (a local cluster, a service unit).

#include <string>
#include <vector>

namespace moeserve::server {

// The environment variable that names the demo tokenizer directory, overriding the search.
inline constexpr const char* kDemoTokenizerEnv = "MOESERVE_DEMO_TOKENIZER";

// The directories looked at, in order: $MOESERVE_DEMO_TOKENIZER alone when it is set; otherwise
// .cache/tokenizer-qwen3 under the working directory, then under the binary's directory and each of its
// parents up to three levels (build/moeserve finds the checkout's .cache).
std::vector<std::string> demo_tokenizer_candidates();

// The first candidate holding tokenizer.json; throws moeserve::Error naming every place it looked.
std::string find_demo_tokenizer();

}  // namespace moeserve::server
