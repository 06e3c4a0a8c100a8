#include "loadgen/stats.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loadgen/record.h"
#include "loadgen/report.h"

namespace moeserve::loadgen {
namespace {

// Expected values computed by hand with numpy's definitions (linear interpolation, population std).
TEST(Stats, PercentilesInterpolateBetweenClosestRanks) {
  std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 50), 5.5);   // rank 4.5
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 90), 9.1);   // rank 8.1
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 99), 9.91);  // rank 8.91
  EXPECT_DOUBLE_EQ(percentile_sorted(v, 100), 10);
  EXPECT_DOUBLE_EQ(percentile_sorted(std::vector<double>{7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile_sorted(std::vector<double>{}, 50), 0);
}

TEST(Stats, DistributionOfUnsortedValues) {
  Distribution d = Distribution::of({4, 1, 3, 2});
  EXPECT_EQ(d.count, 4u);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.std, std::sqrt(1.25));  // ((1.5² + 0.5²) · 2) / 4
  EXPECT_DOUBLE_EQ(d.median, 2.5);
  EXPECT_DOUBLE_EQ(d.p90, 3.7);  // rank 2.7 between 3 and 4
  EXPECT_DOUBLE_EQ(d.p99, 3.97);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 4);
  Distribution back = distribution_from_json(to_json(d));
  EXPECT_DOUBLE_EQ(back.p90, d.p90);
  EXPECT_EQ(back.count, d.count);
}

TEST(Stats, TpotExcludesTheFirstToken) {
  RequestRecord r;
  r.ok = true;
  r.ttft_s = 0.1;
  r.e2e_s = 1.1;
  r.completion_tokens = 11;
  EXPECT_DOUBLE_EQ(r.tpot_s(), 0.1);  // 1.0 s over 10 tokens after the first
  r.completion_tokens = 1;
  EXPECT_DOUBLE_EQ(r.tpot_s(), 0);
}

RequestRecord ok_record(size_t turn, double ttft, double e2e, size_t prompt, size_t completion,
                        size_t cached) {
  RequestRecord r;
  r.ok = true;
  r.turn = turn;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.prompt_tokens = prompt;
  r.completion_tokens = completion;
  r.expected_output_tokens = completion;
  r.exact_output = true;
  r.cached_tokens = cached;
  r.usage_reported = true;
  r.itl_s = std::vector<double>(completion - 1, (e2e - ttft) / static_cast<double>(completion - 1));
  return r;
}

TEST(Stats, SummaryThroughputsFailuresAndTurns) {
  std::vector<RequestRecord> records = {ok_record(0, 0.1, 1.1, 100, 11, 0),
                                        ok_record(1, 0.3, 2.3, 300, 21, 150)};
  RequestRecord failed;
  failed.error_cause = "http_500";
  failed.error_message = "boom";
  records.push_back(failed);
  failed.error_cause = "timeout";
  records.push_back(failed);
  records.push_back(failed);

  nlohmann::json s = summarize(records, 4.0);
  EXPECT_EQ(s["completed"], 2);
  EXPECT_EQ(s["failed"], 3);
  EXPECT_EQ(s["failures"]["http_500"], 1);
  EXPECT_EQ(s["failures"]["timeout"], 2);
  EXPECT_EQ(s["failure_examples"]["http_500"], "boom");
  EXPECT_DOUBLE_EQ(s["request_throughput"], 0.5);
  EXPECT_DOUBLE_EQ(s["input_throughput"], 100.0);  // 400 / 4
  EXPECT_DOUBLE_EQ(s["output_throughput"], 8.0);   // 32 / 4
  EXPECT_DOUBLE_EQ(s["total_throughput"], 108.0);
  EXPECT_DOUBLE_EQ(s["cached_tokens_ratio"], 150.0 / 400.0);
  EXPECT_DOUBLE_EQ(s["exact_output_ratio"], 1.0);
  EXPECT_DOUBLE_EQ(s["ttft_ms"]["mean"], 200.0);
  EXPECT_DOUBLE_EQ(s["ttft_ms"]["median"], 200.0);
  EXPECT_DOUBLE_EQ(s["e2el_ms"]["max"], 2300.0);
  EXPECT_DOUBLE_EQ(s["tpot_ms"]["min"], 100.0);
  EXPECT_EQ(s["itl_ms"]["count"], 30);  // 10 + 20 gaps pooled
  ASSERT_EQ(s["per_turn"].size(), 2u);
  EXPECT_EQ(s["per_turn"][1]["turn"], 2);
  EXPECT_DOUBLE_EQ(s["per_turn"][1]["ttft_ms"]["median"], 300.0);
  EXPECT_DOUBLE_EQ(s["per_turn"][1]["cached_tokens_ratio"], 0.5);
  EXPECT_DOUBLE_EQ(s["per_turn"][0]["cached_tokens_ratio"], 0.0);
}

TEST(Stats, RecordSurvivesJson) {
  RequestRecord r = ok_record(3, 0.25, 1.25, 64, 5, 32);
  r.id = 7;
  r.conversation = 2;
  r.finish_reason = "length";
  RequestRecord back = record_from_json(to_json(r));
  EXPECT_EQ(back.id, 7u);
  EXPECT_EQ(back.turn, 3u);
  EXPECT_EQ(back.conversation, 2u);
  EXPECT_DOUBLE_EQ(back.ttft_s, 0.25);
  EXPECT_DOUBLE_EQ(back.tpot_s(), 0.25);
  EXPECT_EQ(back.itl_s.size(), 4u);
  EXPECT_EQ(back.cached_tokens, 32u);
  EXPECT_EQ(back.finish_reason, "length");
  EXPECT_TRUE(back.exact_output);
}

}  // namespace
}  // namespace moeserve::loadgen
