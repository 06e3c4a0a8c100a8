// The metrics registry renders valid Prometheus exposition: checked by parsing and by promtool itself.
#include "common/metrics.h"

#include <gtest/gtest.h>

#include <thread>

#include "promtool.h"

namespace moeserve::server {
namespace {

TEST(Metrics, RendersCountersGaugesAndLabels) {
  MetricsRegistry reg(Labels{{"model_name", "m\"1"}});
  reg.counter("moeserve:prompt_tokens_total", "Prompt tokens processed.").inc(5);
  reg.counter("moeserve:request_success_total", "Finished requests.", {{"finished_reason", "stop"}}).inc();
  reg.counter("moeserve:request_success_total", "Finished requests.", {{"finished_reason", "length"}}).inc(2);
  reg.gauge("moeserve:num_requests_running", "Running.").set(3);
  std::string text = reg.render();
  EXPECT_NE(text.find("# TYPE moeserve:prompt_tokens_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("moeserve:prompt_tokens_total{model_name=\"m\\\"1\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("moeserve:request_success_total{model_name=\"m\\\"1\",finished_reason=\"length\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("moeserve:num_requests_running{model_name=\"m\\\"1\"} 3\n"), std::string::npos) << text;
}

TEST(Metrics, SameNameAndLabelsIsTheSameMetric) {
  MetricsRegistry reg;
  Counter& a = reg.counter("x_total", "x", {{"k", "v"}});
  Counter& b = reg.counter("x_total", "x", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
  EXPECT_THROW(reg.gauge("x_total", "x"), std::exception);
}

TEST(Metrics, DeclaredFamiliesRenderBeforeTheirFirstSample) {
  // The router lists every family it reports, samples or not (its retries before the first retry).
  MetricsRegistry reg;
  reg.declare("retries_total", "Retries.", MetricsRegistry::Type::kCounter);
  reg.declare("wait_seconds", "Wait.", MetricsRegistry::Type::kHistogram, {0.5});
  EXPECT_EQ(reg.render(),
            "# HELP retries_total Retries.\n# TYPE retries_total counter\n"
            "# HELP wait_seconds Wait.\n# TYPE wait_seconds histogram\n");
  reg.counter("retries_total", "Retries.", {{"reason", "503"}}).inc();
  EXPECT_NE(reg.render().find("# TYPE retries_total counter\nretries_total{reason=\"503\"} 1\n"),
            std::string::npos)
      << reg.render();
  EXPECT_THROW(reg.histogram("wait_seconds", "Wait.", {1.0}), std::exception);  // declared with other buckets
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("lat_seconds", "Latency.", {0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 5.0}) h.observe(v);
  std::string text = reg.render();
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << text;  // le is inclusive
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"1\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_sum 5.65\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_count 4\n"), std::string::npos) << text;
}

TEST(Metrics, HistogramAddsCountsKeptElsewhere) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("batch", "Batch size.", {1, 2, 4});
  h.observe(1);
  const std::vector<uint64_t> more = {0, 3, 1, 2};  // three of 2, one of 3, two above 4 (say 5 and 9)
  h.add(more, 2 * 3 + 3 + 5 + 9);
  std::string text = reg.render();
  EXPECT_NE(text.find("batch_bucket{le=\"1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_bucket{le=\"2\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_bucket{le=\"4\"} 5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_bucket{le=\"+Inf\"} 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_sum 24\n"), std::string::npos) << text;
  EXPECT_NE(text.find("batch_count 7\n"), std::string::npos) << text;
  EXPECT_THROW(h.add(std::vector<uint64_t>{1, 2}, 3), std::exception);  // not one count per bucket
}

TEST(Metrics, CollectorsRunBeforeRendering) {
  MetricsRegistry reg;
  Gauge& g = reg.gauge("queue", "Queued.");
  int calls = 0;
  reg.add_collector([&] { g.set(++calls * 10); });
  EXPECT_NE(reg.render().find("queue 10\n"), std::string::npos);
  EXPECT_NE(reg.render().find("queue 20\n"), std::string::npos);
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry reg;
  Counter& c = reg.counter("c_total", "c");
  Histogram& h = reg.histogram("h", "h", {1.0});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.inc();
        h.observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_EQ(h.bucket_count(0), 40000u);
}

TEST(Metrics, PromtoolAcceptsTheExposition) {
  ASSERT_TRUE(have_promtool()) << "promtool is missing: run scripts/install-deps.sh (Debian package prometheus)";
  MetricsRegistry reg(Labels{{"model_name", "tiny"}});
  reg.counter("moeserve:generation_tokens_total", "Generated tokens.").inc(3);
  reg.gauge("moeserve:kv_cache_usage_perc", "KV cache usage, 0..1.").set(0.25);
  reg.histogram("moeserve:time_to_first_token_seconds", "Time to first token.", latency_buckets()).observe(0.2);
  reg.histogram("moeserve:request_prompt_tokens", "Prompt length.", token_count_buckets()).observe(17);
  std::string text = reg.render();
  auto problems = promtool_problems(text);
  EXPECT_TRUE(problems.empty()) << testing::PrintToString(problems) << "\n" << text;
}

TEST(Metrics, PromtoolRejectsABadExposition) {
  // Guards the check above against a promtool that accepts anything.
  ASSERT_TRUE(have_promtool());
  EXPECT_FALSE(promtool_problems("# TYPE requests counter\nrequests 1\n").empty());
  EXPECT_FALSE(promtool_problems("# TYPE moeserve:x gauge\nmoeserve:x{le=} 1\n").empty());
}

}  // namespace
}  // namespace moeserve::server
