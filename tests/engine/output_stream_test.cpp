#include <gtest/gtest.h>

#include <thread>

#include "engine/engine.h"

namespace moeserve {
namespace {

TEST(OutputStream, DeliversEventsAcrossThreadsAndCollectMergesThem) {
  auto stream = std::make_shared<OutputStream>();
  auto sink = stream->sink();
  std::thread producer([sink] {
    for (int i = 0; i < 3; ++i) {
      GenerateOutput out;
      out.request_id = "r";
      out.tokens = {i, i + 10};
      out.usage.completion_tokens = 2 * (i + 1);
      out.finished = i == 2;
      if (out.finished) out.finish_reason = FinishReason::Length;
      sink(out);
    }
  });
  GenerateOutput all = stream->collect();
  producer.join();
  EXPECT_EQ(all.tokens, (std::vector<int32_t>{0, 10, 1, 11, 2, 12}));
  EXPECT_TRUE(all.finished);
  EXPECT_EQ(all.finish_reason, FinishReason::Length);
  EXPECT_EQ(all.usage.completion_tokens, 6);
  EXPECT_FALSE(stream->next().has_value());  // nothing after the final event
}

TEST(OutputStream, TryNextNeverBlocks) {
  auto stream = std::make_shared<OutputStream>();
  EXPECT_FALSE(stream->try_next().has_value());
  GenerateOutput out;
  out.finished = true;
  stream->sink()(out);
  ASSERT_TRUE(stream->try_next().has_value());
  EXPECT_FALSE(stream->try_next().has_value());
}

TEST(FinishReason, NamesMatchOpenAi) {
  EXPECT_STREQ(to_string(FinishReason::Stop), "stop");
  EXPECT_STREQ(to_string(FinishReason::Length), "length");
  EXPECT_STREQ(to_string(FinishReason::Abort), "abort");
}

}  // namespace
}  // namespace moeserve
