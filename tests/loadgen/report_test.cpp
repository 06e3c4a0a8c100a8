// The compare table, the printed summary and the SVG plot, from hand-made result documents.
#include "loadgen/report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <fmt/format.h>

#include "loadgen/plot.h"
#include "loadgen/progress.h"
#include "loadgen/record.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

json run(const std::string& scenario, size_t concurrency, double output_tps, size_t turns = 1) {
  std::vector<RequestRecord> records;
  for (size_t i = 0; i < 20; ++i) {
    RequestRecord r;
    r.id = i;
    r.ok = true;
    r.turn = i % turns;
    r.ttft_s = 0.01 * static_cast<double>(1 + i % 7) * static_cast<double>(concurrency);
    r.e2e_s = r.ttft_s + 0.5;
    r.itl_s = {0.01, 0.02, 0.015};
    r.completion_tokens = 4;
    r.prompt_tokens = 100 * (1 + r.turn);
    r.cached_tokens = 80 * r.turn;
    r.usage_reported = true;
    records.push_back(r);
  }
  json s = summarize(records, 1.0);
  s["output_throughput"] = output_tps;
  s["total_throughput"] = 3 * output_tps;
  json requests = json::array();
  for (auto& r : records) requests.push_back(to_json(r));
  return {{"scenario", scenario},
          {"concurrency", concurrency},
          {"request_rate", 0.0},
          {"summary", s},
          {"requests", requests}};
}

json document(const std::string& label, std::vector<json> runs) {
  return {{"label", label},
          {"started_at", "2026-12-02T10:00:00Z"},
          {"config",
           {{"url", "http://127.0.0.1:30000"},
            {"model", "demo <&> \"model\""},
            {"input_len", 256},
            {"output_len", 128}}},
          {"runs", runs}};
}

TEST(Compare, DifferencesAreAgainstTheFirstFile) {
  std::vector<CompareInput> inputs = {
      {"vllm", document("vllm", {run("single_turn", 16, 1000), run("multi_turn", 16, 500, 10)})},
      {"moeserve", document("moeserve", {run("single_turn", 16, 1250), run("multi_turn", 16, 450, 10)})}};
  std::string table = compare_table(inputs);
  EXPECT_NE(table.find("+25.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("-10.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("1250.0"), std::string::npos);
  EXPECT_NE(table.find("c=16"), std::string::npos);
  // Rows of one scenario stay together, baseline first.
  EXPECT_LT(table.find("single_turn"), table.find("multi_turn"));
  EXPECT_LT(table.find("vllm"), table.find("moeserve"));
  std::string total = compare_table(inputs, "total");
  EXPECT_NE(total.find("+25.0%"), std::string::npos);
  EXPECT_NE(total.find("total_throughput"), std::string::npos);
  EXPECT_THROW(compare_table(inputs, "latency"), std::exception);
  EXPECT_THROW(compare_table({{"x", json::object()}}), std::exception);
}

TEST(Compare, LatencyColumnsAreEachRowsOwnPercentiles) {
  json fast = run("single_turn", 2, 900), slow = run("single_turn", 16, 1000);
  std::string table = compare_table({{"a", document("a", {fast})}, {"b", document("b", {slow})}});
  // One row per endpoint: 13 whitespace-separated cells, latencies last (ms).
  auto cells_of = [&](const std::string& label) {
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      std::vector<std::string> cells;
      for (std::string c; in >> c;) cells.push_back(c);
      if (cells.size() == 13 && cells[2] == label) return cells;
    }
    ADD_FAILURE() << "no row for " << label << " in\n" << table;
    return std::vector<std::string>(13);
  };
  for (auto [label, r] : {std::pair{"a", &fast}, std::pair{"b", &slow}}) {
    const json& s = (*r)["summary"];
    auto ms = [&](const char* m, const char* q) { return fmt::format("{:.1f}", s[m][q].get<double>()); };
    std::vector<std::string> cells = cells_of(label);
    EXPECT_EQ(cells[8], ms("ttft_ms", "median")) << table;
    EXPECT_EQ(cells[9], ms("ttft_ms", "p99"));
    EXPECT_EQ(cells[10], ms("tpot_ms", "median"));
    EXPECT_EQ(cells[11], ms("itl_ms", "p99"));
    EXPECT_EQ(cells[12], ms("e2el_ms", "median"));
  }
  // TTFT scales with the concurrency in run(): the rows must not share one set of latencies.
  EXPECT_NE(cells_of("a")[8], cells_of("b")[8]);
}

TEST(Progress, BarFollowsRequestsOrTimeWhicheverIsFurther) {
  Progress p;
  p.planned = 40;
  p.completed = 9;
  p.failed = 1;
  p.in_flight = 4;
  p.elapsed_s = 125;
  std::string line = ProgressBar::render("single_turn c=4", p, 8);
  EXPECT_EQ(line, "single_turn c=4 │██      │ 10/40 req  0.1 req/s  1 failed  4 in flight  02:05");
  p.completed = 10;  // 11/40 of 8 cells = 2.2 cells: two full blocks and an eighth-block remainder
  EXPECT_NE(ProgressBar::render("t", p, 8).find("██▏     │"), std::string::npos);
  p.duration_s = 250;  // half the time gone wins over 11/40 of the requests
  EXPECT_NE(ProgressBar::render("t", p, 8).find("████    │"), std::string::npos);
  p.finished = true;
  EXPECT_NE(ProgressBar::render("t", p, 8).find("████████│"), std::string::npos);
  Progress unbounded;
  unbounded.completed = 3;
  EXPECT_NE(ProgressBar::render("t", unbounded, 4).find("│    │ 3 req"), std::string::npos);
}

TEST(Report, RunBlockShowsTheMetrics) {
  json r = run("multi_turn", 4, 123.0, 3);
  std::string text = format_run(r);
  for (const char* needle : {"multi_turn", "c=4", "Successful requests:", "Output token throughput",
                             "P90 / P99", "Time to First Token", "Per turn", "cached prompt"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
}

// Well-formedness is checked by a real XML parser (xmllint, libxml2-utils from scripts/install-deps.sh).
void expect_well_formed_svg(const std::string& svg, const std::string& name) {
  std::string path = testing::TempDir() + name;
  std::ofstream(path) << svg;
  ASSERT_EQ(std::system("command -v xmllint >/dev/null"), 0)
      << "xmllint is missing: run scripts/install-deps.sh (package libxml2-utils)";
  EXPECT_EQ(std::system(("xmllint --noout " + path).c_str()), 0) << path;
}

TEST(Plot, SweepAndTurnsMakeAWellFormedSvg) {
  json doc = document("sweep", {run("single_turn", 1, 100), run("single_turn", 4, 350),
                                run("single_turn", 16, 900), run("multi_turn", 4, 300, 5)});
  std::string svg = plot_svg(doc);
  expect_well_formed_svg(svg, "bench_plot_sweep.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("Time to first token"), std::string::npos);
  EXPECT_NE(svg.find("TTFT per turn"), std::string::npos);
  EXPECT_NE(svg.find("Throughput"), std::string::npos);
  EXPECT_NE(svg.find("demo &lt;&amp;&gt; &quot;model&quot;"), std::string::npos);  // escaped
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++lines;
  EXPECT_GE(lines, 4u * 4 + 2 + 4);  // 4 CDFs x 4 runs, 2 per-turn lines, sweep lines
}

TEST(Plot, SingleRunAndEmptyDocumentsAreWellFormed) {
  expect_well_formed_svg(plot_svg(document("one", {run("long_gen", 1, 50)})), "bench_plot_one.svg");
  std::string empty = plot_svg(document("none", {}));
  expect_well_formed_svg(empty, "bench_plot_empty.svg");
  EXPECT_NE(empty.find("No runs"), std::string::npos);
  EXPECT_EQ(plot_svg(document("one", {run("long_gen", 1, 50)})).find("Sweep"), std::string::npos);
}

}  // namespace
}  // namespace moeserve::loadgen
