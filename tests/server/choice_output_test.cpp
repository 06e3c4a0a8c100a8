// ChoiceOutput takes events of several tokens (a speculative decoding step) as if each token came alone:
// the same text, reasoning, tokens and stop cut, and the answer's text put down to the tokens that wrote it.
#include "server/choice_output.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace moeserve::server {
namespace {

const char* kTokenizer = ".cache/tokenizer-qwen3/tokenizer.json";

class ChoiceOutputSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kTokenizer)) << "run scripts/fetch-test-data.sh first";
    tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(kTokenizer));
    ids_ = tokenizer_->encode("Let me check the sky</think>\n\nIt is sunny in Paris today.", false);
  }

  // The choice after `ids_` came in events of `step` tokens (the last one finishing it), each token's
  // logprob its index; `spans` receives every event's content_tokens.
  ChoiceOutput run(size_t step, std::vector<std::string> stops,
                   std::vector<std::pair<size_t, size_t>>& spans) const {
    text::StreamingOptions options;
    options.stops = std::move(stops);
    options.parser.emplace();
    options.parser->reasoning_parser = "qwen3";
    options.parser->starts_in_reasoning = true;
    ChoiceOutput c(0, 0, tokenizer_.get(), options);
    for (size_t from = 0; from < ids_.size() && !c.finished(); from += step) {
      GenerateOutput out;
      for (size_t i = from; i < std::min(from + step, ids_.size()); ++i) {
        out.tokens.push_back(ids_[i]);
        LogprobEntry& e = out.logprobs.emplace_back();
        e.token = ids_[i];
        e.logprob = -float(i);
      }
      out.finished = from + step >= ids_.size();
      out.finish_reason = out.finished ? FinishReason::Length : FinishReason::None;
      const ChoiceDelta d = c.push(out);
      spans.insert(spans.end(), d.content_tokens.begin(), d.content_tokens.end());
    }
    return c;
  }

  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::vector<int32_t> ids_;
};

TEST_F(ChoiceOutputSteps, AnswerTokensAreThoseThatWroteTheAnswer) {
  std::vector<std::pair<size_t, size_t>> one_spans, four_spans;
  const ChoiceOutput one = run(1, {}, one_spans);
  const ChoiceOutput four = run(4, {}, four_spans);
  EXPECT_EQ(one.message().reasoning_content, "Let me check the sky");
  EXPECT_EQ(one.message().content, "It is sunny in Paris today.");
  // The answer starts at "It", after "</think>" and "\n\n", whichever step brought them.
  const size_t it =
      size_t(std::find(ids_.begin(), ids_.end(), tokenizer_->encode("It", false)[0]) - ids_.begin());
  ASSERT_EQ(one.content_tokens(), (std::vector<std::pair<size_t, size_t>>{{it, ids_.size()}}));
  EXPECT_EQ(four.content_tokens(), one.content_tokens());
  EXPECT_EQ(four.message().reasoning_content, one.message().reasoning_content);
  EXPECT_EQ(four.message().content, one.message().content);
  EXPECT_EQ(four.tokens(), one.tokens());
  // Each event's spans are its own tokens that wrote some of the answer.
  for (const auto& [from, to] : four_spans) EXPECT_GE(from, it);
  size_t covered = 0;
  for (const auto& [from, to] : four_spans) covered += to - from;
  EXPECT_EQ(covered, ids_.size() - it);
}

TEST_F(ChoiceOutputSteps, AStopStringInsideAStepDropsTheTokensAfterIt) {
  std::vector<std::pair<size_t, size_t>> spans;
  const ChoiceOutput one = run(1, {"sunny"}, spans);
  const ChoiceOutput four = run(4, {"sunny"}, spans);
  EXPECT_EQ(one.finish_reason(), "stop");
  EXPECT_EQ(one.message().content, "It is ");
  EXPECT_EQ(four.finish_reason(), "stop");
  EXPECT_EQ(four.message().content, one.message().content);
  EXPECT_EQ(four.tokens(), one.tokens());
  ASSERT_EQ(four.logprobs().size(), one.tokens().size());
  EXPECT_EQ(four.logprobs().back().logprob, -float(one.tokens().size() - 1));
  EXPECT_EQ(four.content_tokens(), one.content_tokens());
}

}  // namespace
}  // namespace moeserve::server
