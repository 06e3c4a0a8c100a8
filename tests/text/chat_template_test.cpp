#include "text/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace moeserve::text {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string template_source(const std::string& name) {
  if (name == "qwen3_5") return testing::read_text("tests/fixtures/chat-templates/qwen3_5.jinja");
  testing::qwen3_tokenizer_path();
  auto config =
      ordered_json::parse(testing::read_text(std::string(testing::kQwen3Dir) + "/tokenizer_config.json"));
  return config["chat_template"].get<std::string>();
}

// Renders a golden case; returns the prompt, or "Kind: message" when the template raises (the goldens'
// format for Python exceptions).
std::string render_case(const ordered_json& c) {
  ChatTemplate t(template_source(c["template"]));
  ordered_json kwargs = ordered_json::object();
  if (c.contains("enable_thinking")) kwargs["enable_thinking"] = c["enable_thinking"];
  try {
    return t.render(c["messages"], c.contains("tools") ? c["tools"] : ordered_json(),
                    c.value("add_generation_prompt", true), kwargs);
  } catch (const jinja::TemplateError& e) {
    return e.kind() + ": " + e.what();
  }
}

TEST(ChatTemplate, RendersHuggingFaceGoldensByteForByte) {
  auto goldens = ordered_json::parse(testing::read_text("tests/fixtures/goldens/chat-template-goldens.json"));
  ASSERT_GE(goldens["cases"].size(), 20u);
  for (const auto& c : goldens["cases"]) {
    std::string expected =
        c.contains("rendered") ? c["rendered"].get<std::string>() : c["error"].get<std::string>();
    EXPECT_EQ(render_case(c), expected) << c["template"] << "/" << c["name"];
  }
}

TEST(ChatTemplate, OpenAIArgumentStringsBecomeMappings) {
  auto messages = ordered_json::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1, \"y\": [2]}"}},
      {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}])");
  auto normalized = ChatTemplate::normalize_openai_messages(messages);
  EXPECT_EQ(normalized[1]["tool_calls"][0]["function"]["arguments"],
            ordered_json::parse(R"({"x": 1, "y": [2]})"));
  EXPECT_EQ(normalized[1]["tool_calls"][1]["function"]["arguments"], "not json");
  normalized[1]["tool_calls"].erase(1);  // a non-JSON argument string stays a string; |items would raise
  ChatTemplate t(template_source("qwen3_5"));
  EXPECT_THAT(
      t.render(normalized, nullptr, false),
      ::testing::HasSubstr("<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=y>\n[2]\n</parameter>"));
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  try {
    ChatTemplate t("line one\n{% if x %}\n{% endfor %}");
    FAIL() << "no error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(e.kind(), "TemplateSyntaxError");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("line 3"));
  }
}

}  // namespace
}  // namespace moeserve::text
