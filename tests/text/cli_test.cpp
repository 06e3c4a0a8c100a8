#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "run_process.h"
#include "test_util.h"

namespace moeserve::text {
namespace {

using peers::RunResult;

// Runs the built moeserve binary with a shell command line (stderr joins stdout with 2>&1).
RunResult run(const std::string& args) {
  return peers::run_shell(std::string(MOESERVE_BINARY) + " " + args);
}

TEST(Cli, TokenizeEncodesLikeTheGoldensAndDecodes) {
  testing::qwen3_tokenizer_path();
  RunResult r = run(std::string("tokenize --tokenizer ") + testing::kQwen3Dir + " --text 'Hello, world!'");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[9707, 11, 1879, 0]"));
  r = run(std::string("tokenize --tokenizer ") + testing::kQwen3Dir + " --decode 9707,11,1879,0");
  EXPECT_EQ(r.out, "Hello, world!\n");
  // The JSON list that encoding prints is accepted back as it is.
  r = run(std::string("tokenize --tokenizer ") + testing::kQwen3Dir + " --decode '[9707, 11, 1879, 0]'");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "Hello, world!\n");
}

TEST(Cli, TokenizeDecodeRejectsJunkIds) {
  testing::qwen3_tokenizer_path();
  auto error_of = [](const std::string& ids) {
    RunResult r =
        run(std::string("tokenize --tokenizer ") + testing::kQwen3Dir + " --decode '" + ids + "' 2>&1");
    EXPECT_EQ(r.status, 1) << ids;
    return r.out;
  };
  EXPECT_THAT(error_of("1,x"), ::testing::HasSubstr("'x' is not an integer id"));
  EXPECT_THAT(error_of("1.5"), ::testing::HasSubstr("'1.5' is not an integer id"));
  EXPECT_THAT(error_of("1,,2"), ::testing::HasSubstr("has an empty id"));
  EXPECT_THAT(error_of("[1,2"), ::testing::HasSubstr("has an unmatched bracket"));
  EXPECT_THAT(error_of("99999999999"), ::testing::HasSubstr("id 99999999999 is out of range"));
  EXPECT_THAT(error_of("-1"), ::testing::HasSubstr("id -1 is out of range"));
  EXPECT_THAT(error_of("999999"),
              ::testing::HasSubstr("id 999999 is past the tokenizer's vocabulary (151669 ids)"));
}

TEST(Cli, RenderMatchesTheGoldenAndReportsTemplateErrors) {
  auto goldens =
      nlohmann::ordered_json::parse(testing::read_text("tests/fixtures/goldens/chat-template-goldens.json"));
  const auto& c = goldens["cases"][2];  // qwen3_5 no_thinking
  ASSERT_EQ(c["name"], "no_thinking");
  std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/messages.json") << c["messages"].dump();
  RunResult r = run("render --template tests/fixtures/chat-templates/qwen3_5.jinja --messages " + dir +
                    "/messages.json --enable-thinking false");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, c["rendered"].get<std::string>());

  std::ofstream(dir + "/request.json") << R"({"messages": [{"role": "assistant", "content": "no user"}]})";
  r = run("render --template tests/fixtures/chat-templates/qwen3_5.jinja --request " + dir +
          "/request.json 2>&1");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, ::testing::HasSubstr("error: TemplateError: No user query found in messages."));
}

}  // namespace
}  // namespace moeserve::text
