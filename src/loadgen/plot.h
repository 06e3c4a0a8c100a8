#pragma once
// The picture of a results document (--plot): latency CDFs (TTFT, TPOT, ITL, end-to-end) for every run, TTFT
// and the cached share of the prompt per turn for multi-turn runs, and throughput and latency against
// concurrency when the document holds a sweep. A self-contained SVG file (no scripts, no external fonts).

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace moeserve::loadgen {

std::string plot_svg(const nlohmann::json& document);

}  // namespace moeserve::loadgen
