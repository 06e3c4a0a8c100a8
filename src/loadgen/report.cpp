#include "loadgen/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "common/error.h"
#include "loadgen/stats.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

double ratio(double part, double whole) {
  return whole > 0 ? part / whole : 0;
}

std::vector<double> ms(const std::vector<RequestRecord>& records, double (*pick)(const RequestRecord&)) {
  std::vector<double> v;
  for (const auto& r : records)
    if (r.ok) v.push_back(pick(r) * 1e3);
  return v;
}

// "c=16" for a closed loop, "r=4/s" (or "r=4/s c≤16") for Poisson arrivals.
std::string load_label(const json& run) {
  double rate = run.value("request_rate", 0.0);
  size_t conc = run.value("concurrency", size_t{0});
  if (rate <= 0) return fmt::format("c={}", conc);
  std::string label = fmt::format("r={:g}/s", rate);
  if (conc > 0) label += fmt::format(" c<={}", conc);
  return label;
}

const char* metric_key(const std::string& metric) {
  if (metric == "output") return "output_throughput";
  if (metric == "total") return "total_throughput";
  if (metric == "requests") return "request_throughput";
  fail("unknown compare metric '{}': use output, total or requests", metric);
}

// Width in terminal columns: UTF-8 continuation bytes take none, so "—" pads like one column.
size_t display_width(const std::string& s) {
  size_t len = 0;
  for (unsigned char c : s) len += (c & 0xC0) != 0x80;
  return len;
}

std::string pad(const std::string& s, size_t width, bool right) {
  size_t len = display_width(s);
  if (len >= width) return s;
  return right ? std::string(width - len, ' ') + s : s + std::string(width - len, ' ');
}

}  // namespace

json summarize(const std::vector<RequestRecord>& records, double duration_s) {
  size_t ok = 0, failed = 0;
  double input = 0, output = 0, cached = 0;
  size_t exact_outputs = 0, exact_checked = 0;
  std::map<std::string, size_t> failures;
  std::map<std::string, std::string> examples;
  std::vector<double> itl;
  for (const auto& r : records) {
    if (!r.ok) {
      ++failed;
      ++failures[r.error_cause];
      examples.emplace(r.error_cause, r.error_message);
      continue;
    }
    ++ok;
    input += static_cast<double>(r.usage_reported ? r.prompt_tokens : r.expected_input_tokens);
    output += static_cast<double>(r.completion_tokens);
    cached += static_cast<double>(r.cached_tokens);
    for (double s : r.itl_s) itl.push_back(s * 1e3);
    if (r.usage_reported && r.exact_output) {
      ++exact_checked;
      exact_outputs += r.completion_tokens == r.expected_output_tokens;
    }
  }
  json s = {
      {"completed", ok},
      {"failed", failed},
      {"failures", failures},
      {"failure_examples", examples},
      {"duration_s", duration_s},
      {"request_throughput", ratio(static_cast<double>(ok), duration_s)},
      {"input_throughput", ratio(input, duration_s)},
      {"output_throughput", ratio(output, duration_s)},
      {"total_throughput", ratio(input + output, duration_s)},
      {"total_input_tokens", input},
      {"total_output_tokens", output},
      {"total_cached_tokens", cached},
      {"cached_tokens_ratio", ratio(cached, input)},
      // Requests whose output length was exactly max_tokens (checks ignore_eos/min_tokens took effect).
      {"exact_output_ratio", ratio(static_cast<double>(exact_outputs), static_cast<double>(exact_checked))},
      {"ttft_ms", to_json(Distribution::of(ms(records, [](const RequestRecord& r) { return r.ttft_s; })))},
      {"itl_ms", to_json(Distribution::of(std::move(itl)))},
      {"e2el_ms", to_json(Distribution::of(ms(records, [](const RequestRecord& r) { return r.e2e_s; })))},
  };
  // TPOT is undefined for one-token replies; drop those from its distribution.
  {
    std::vector<double> tpot;
    for (const auto& r : records)
      if (r.ok && r.completion_tokens > 1) tpot.push_back(r.tpot_s() * 1e3);
    s["tpot_ms"] = to_json(Distribution::of(std::move(tpot)));
  }

  size_t turns = 0;
  for (const auto& r : records) turns = std::max(turns, r.turn + 1);
  if (turns > 1) {
    json per_turn = json::array();
    for (size_t t = 0; t < turns; ++t) {
      std::vector<double> ttft;
      double prompt = 0, turn_cached = 0;
      size_t requests = 0, turn_failed = 0;
      for (const auto& r : records) {
        if (r.turn != t) continue;
        ++requests;
        if (!r.ok) {
          ++turn_failed;
          continue;
        }
        ttft.push_back(r.ttft_s * 1e3);
        prompt += static_cast<double>(r.prompt_tokens);
        turn_cached += static_cast<double>(r.cached_tokens);
      }
      size_t turn_ok = requests - turn_failed;
      per_turn.push_back({{"turn", t + 1},
                          {"requests", requests},
                          {"failed", turn_failed},
                          {"ttft_ms", to_json(Distribution::of(std::move(ttft)))},
                          {"prompt_tokens_mean", ratio(prompt, static_cast<double>(turn_ok))},
                          {"cached_tokens_ratio", ratio(turn_cached, prompt)}});
    }
    s["per_turn"] = std::move(per_turn);
  }
  size_t tool_returned = 0;
  for (const auto& r : records) tool_returned += r.ok && r.tool_calls > 0;
  s["tool_calls_returned"] = tool_returned;
  // Pictures of the requests that completed (the image scenario): what the server's tower got through.
  double images = 0;
  for (const auto& r : records) images += r.ok ? double(r.images) : 0;
  if (images > 0) {
    s["total_images"] = images;
    s["image_throughput"] = ratio(images, duration_s);
  }
  return s;
}

std::string format_run(const json& run) {
  const json& s = run.at("summary");
  std::string out;
  auto line = [&](std::string_view name, const std::string& value) {
    out += fmt::format("{:<40}{}\n", name, value);
  };
  auto num = [](double v, int digits = 2) { return fmt::format("{:.{}f}", v, digits); };
  std::string title = fmt::format(" {} · {} ", run.value("scenario", "?"), load_label(run));
  out += fmt::format("{:=^64}\n", title);
  line("Successful requests:", std::to_string(s.value("completed", 0)));
  line("Failed requests:", std::to_string(s.value("failed", 0)));
  for (auto& [cause, count] : s["failures"].items())
    line(fmt::format("  {}:", cause),
         fmt::format("{}  ({})", count.get<size_t>(),
                     s["failure_examples"].value(cause, std::string{}).substr(0, 60)));
  line("Benchmark duration (s):", num(s.value("duration_s", 0.0)));
  line("Total input tokens:", num(s.value("total_input_tokens", 0.0), 0));
  line("Total generated tokens:", num(s.value("total_output_tokens", 0.0), 0));
  line("Request throughput (req/s):", num(s.value("request_throughput", 0.0)));
  line("Output token throughput (tok/s):", num(s.value("output_throughput", 0.0)));
  line("Total token throughput (tok/s):", num(s.value("total_throughput", 0.0)));
  if (s.contains("image_throughput")) {
    line("Total images:", num(s.value("total_images", 0.0), 0));
    line("Image throughput (images/s):", num(s.value("image_throughput", 0.0)));
  }
  line("Cached prompt tokens:", fmt::format("{:.1f}%", 100 * s.value("cached_tokens_ratio", 0.0)));
  line("Output length exactly max_tokens:", fmt::format("{:.1f}%", 100 * s.value("exact_output_ratio", 0.0)));
  if (run.value("scenario", "") == "tool_call")
    line("Tool calls returned by the model:", std::to_string(s.value("tool_calls_returned", 0)));
  for (auto [key, name] :
       {std::pair{"ttft_ms", "Time to First Token"}, std::pair{"tpot_ms", "Time per Output Token"},
        std::pair{"itl_ms", "Inter-token Latency"}, std::pair{"e2el_ms", "End-to-end Latency"}}) {
    Distribution d = distribution_from_json(s.at(key));
    out += fmt::format("{:-^64}\n", fmt::format(" {} (ms) ", name));
    line("Mean / median:", fmt::format("{:.2f} / {:.2f}", d.mean, d.median));
    line("P90 / P99:", fmt::format("{:.2f} / {:.2f}", d.p90, d.p99));
  }
  if (s.contains("per_turn")) {
    out += fmt::format("{:-^64}\n", " Per turn ");
    out += fmt::format("{:>6}{:>10}{:>14}{:>14}{:>16}\n", "turn", "requests", "TTFT p50 ms", "TTFT p90 ms",
                       "cached prompt");
    for (const json& t : s["per_turn"]) {
      Distribution d = distribution_from_json(t["ttft_ms"]);
      out += fmt::format("{:>6}{:>10}{:>14.2f}{:>14.2f}{:>15.1f}%\n", t.value("turn", 0),
                         t.value("requests", 0), d.median, d.p90, 100 * t.value("cached_tokens_ratio", 0.0));
    }
  }
  out += std::string(64, '=') + "\n";
  return out;
}

std::string compare_table(const std::vector<CompareInput>& inputs, const std::string& metric) {
  const char* key = metric_key(metric);
  // Rows grouped by (scenario, load) in the order they first appear; within a group, input order.
  struct Row {
    std::string label;
    const json* run;
  };
  std::vector<std::pair<std::string, std::string>> groups;
  std::map<std::pair<std::string, std::string>, std::vector<Row>> rows;
  for (const auto& in : inputs) {
    check(in.document.contains("runs") && in.document["runs"].is_array(),
          "{}: not a moeserve bench result (no \"runs\" array)", in.label);
    for (const json& run : in.document["runs"]) {
      std::pair<std::string, std::string> group{run.value("scenario", "?"), load_label(run)};
      if (!rows.count(group)) groups.push_back(group);
      rows[group].push_back({in.label, &run});
    }
  }
  std::vector<std::string> head = {"scenario",  "load",        "endpoint", "ok/fail",  "req/s",
                                   "out tok/s", "total tok/s", "diff %",   "TTFT p50", "TTFT p99",
                                   "TPOT p50",  "ITL p99",     "E2E p50"};
  std::vector<std::vector<std::string>> table;
  for (const auto& group : groups) {
    double base = -1;
    for (const Row& row : rows[group]) {
      const json& s = row.run->at("summary");
      double value = s.value(key, 0.0);
      std::string diff = "—";
      if (base < 0) {
        base = value;
      } else if (base > 0) {
        diff = fmt::format("{:+.1f}%", 100 * (value - base) / base);
      }
      auto p = [&](const char* m, const char* q) {
        return fmt::format("{:.1f}", s.contains(m) ? s[m].value(q, 0.0) : 0.0);
      };
      table.push_back({group.first, group.second, row.label,
                       fmt::format("{}/{}", s.value("completed", 0), s.value("failed", 0)),
                       fmt::format("{:.2f}", s.value("request_throughput", 0.0)),
                       fmt::format("{:.1f}", s.value("output_throughput", 0.0)),
                       fmt::format("{:.1f}", s.value("total_throughput", 0.0)), diff, p("ttft_ms", "median"),
                       p("ttft_ms", "p99"), p("tpot_ms", "median"), p("itl_ms", "p99"),
                       p("e2el_ms", "median")});
    }
  }
  std::vector<size_t> width(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    width[c] = head[c].size();
    for (const auto& row : table) width[c] = std::max(width[c], display_width(row[c]));
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) out += (c ? "  " : "") + pad(cells[c], width[c], c >= 3);
    out += '\n';
  };
  emit(head);
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  out += std::string(total - 2, '-') + '\n';
  for (const auto& row : table) emit(row);
  out += fmt::format("diff %: {} vs the first file's row of the same scenario and load; latencies in ms.\n",
                     key);
  return out;
}

}  // namespace moeserve::loadgen
