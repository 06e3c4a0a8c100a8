#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_process.h"
#include "test_util.h"
#include "text/chat_template.h"

namespace moeserve::text {
namespace {

using ordered_json = nlohmann::ordered_json;

// Deterministic random conversations: system/user/assistant/tool turns, reasoning, tool calls with nested
// arguments, content-part lists, with and without tools, generation prompt and enable_thinking.
class Conversations {
 public:
  explicit Conversations(uint64_t seed) : s_(seed) {}

  ordered_json next_case(bool content_parts) {
    ordered_json messages = ordered_json::array();
    if (pick(3) == 0) messages.push_back({{"role", "system"}, {"content", text()}});
    int turns = 1 + static_cast<int>(pick(4));
    for (int t = 0; t < turns; ++t) {
      if (content_parts && pick(3) == 0) {
        messages.push_back({{"role", "user"},
                            {"content", ordered_json::array({{{"type", "text"}, {"text", text()}},
                                                             {{"type", "image"}},
                                                             {{"type", "text"}, {"text", text()}}})}});
      } else {
        messages.push_back({{"role", "user"}, {"content", text()}});
      }
      ordered_json a = {{"role", "assistant"}, {"content", pick(4) == 0 ? "" : text()}};
      if (pick(3) == 0) a["reasoning_content"] = text();
      if (pick(4) == 0) a["content"] = "<think>\n" + text() + "\n</think>\n\n" + text();
      if (pick(2) == 0) {
        ordered_json calls = ordered_json::array();
        for (int c = 0, n = 1 + static_cast<int>(pick(2)); c < n; ++c)
          calls.push_back(
              {{"type", "function"}, {"function", {{"name", word()}, {"arguments", arguments()}}}});
        a["tool_calls"] = calls;
        messages.push_back(a);
        for (int r = 0, n = 1 + static_cast<int>(pick(2)); r < n; ++r)
          messages.push_back({{"role", "tool"}, {"content", text()}});
        if (pick(2) == 0) messages.push_back({{"role", "assistant"}, {"content", text()}});
      } else if (t + 1 < turns || pick(2) == 0) {
        messages.push_back(a);
      }
    }
    ordered_json vars = {{"messages", messages},
                         {"add_generation_prompt", pick(4) != 0},
                         {"bos_token", ""},
                         {"eos_token", "<|im_end|>"}};
    vars["tools"] = pick(2) == 0 ? tools() : ordered_json();
    if (pick(3) == 0) vars["enable_thinking"] = pick(2) == 0;
    return vars;
  }

 private:
  uint64_t pick(uint64_t n) {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return (s_ >> 33) % n;
  }
  std::string word() {
    const char* words[] = {"weather", "search", "北京", "price", "café", "x", "get_time", "hello", "Q&A"};
    return words[pick(std::size(words))];
  }
  // Padding is newlines only: @huggingface/jinja's strip('\n')/lstrip('\n') also strip spaces, Python's do
  // not (we follow Python; jinja_test covers it).
  std::string text() {
    std::string t;
    for (int i = 0, n = 1 + static_cast<int>(pick(6)); i < n; ++i)
      t += (i ? (pick(5) == 0 ? "\n" : " ") : "") + word();
    if (pick(6) == 0) t = "\n" + t + "\n";
    return t;
  }
  ordered_json arguments() {
    ordered_json args = ordered_json::object();
    for (int i = 0, n = static_cast<int>(pick(4)); i < n; ++i) {
      switch (pick(5)) {
        case 0:
          args[word() + std::to_string(i)] = text();
          break;
        case 1:
          args[word() + std::to_string(i)] = static_cast<int>(pick(1000));
          break;
        // No booleans: @huggingface/jinja prints them as JS does ("true"), Python Jinja2 as "True" (we follow
        // Python, which transformers uses; jinja_test covers it).
        case 2:
          args[word() + std::to_string(i)] = "yes";
          break;
        case 3:
          args[word() + std::to_string(i)] = ordered_json::array({word(), static_cast<int>(pick(9))});
          break;
        default:
          args[word() + std::to_string(i)] = {{"k", word()}, {"n", ordered_json::array()}};
      }
    }
    return args;
  }
  ordered_json tools() {
    ordered_json list = ordered_json::array();
    for (int i = 0, n = 1 + static_cast<int>(pick(2)); i < n; ++i)
      list.push_back({{"type", "function"},
                      {"function",
                       {{"name", word()},
                        {"description", text()},
                        {"parameters",
                         {{"type", "object"},
                          {"properties", {{"q", {{"type", "string"}}}}},
                          {"required", ordered_json::array({"q"})}}}}}});
    return list;
  }
  uint64_t s_;
};

std::string run_oracle(const std::string& input_path) {
  return peers::run_process({"node", "tests/text/jinja_oracle.mjs", input_path}).out;
}

void compare_with_oracle(const std::string& name, const std::string& source, bool content_parts) {
  ASSERT_TRUE(std::filesystem::exists(".cache/npm-oracles/node_modules/@huggingface/jinja/package.json"))
      << "the @huggingface/jinja oracle is missing: run scripts/fetch-test-data.sh";
  Conversations gen(name.size() * 7919);
  ordered_json cases = ordered_json::array();
  for (int i = 0; i < 200; ++i) cases.push_back(gen.next_case(content_parts));
  std::string path = ::testing::TempDir() + "/oracle-" + name + ".json";
  std::ofstream(path) << ordered_json({{"template", source}, {"cases", cases}}).dump();
  auto theirs = ordered_json::parse(run_oracle(path), nullptr, false);
  ASSERT_TRUE(theirs.is_array() && theirs.size() == cases.size()) << "the oracle (node) did not answer";

  ChatTemplate t(source, "", "<|im_end|>");
  int rendered = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& v = cases[i];
    ordered_json kwargs = ordered_json::object();
    if (v.contains("enable_thinking")) kwargs["enable_thinking"] = v["enable_thinking"];
    std::string ours, error;
    try {
      ours = t.render(v["messages"], v["tools"], v["add_generation_prompt"].get<bool>(), kwargs);
    } catch (const jinja::TemplateError& e) {
      error = e.what();
    }
    if (theirs[i].contains("error")) {
      EXPECT_FALSE(error.empty()) << name << " case " << i << ": the oracle failed (" << theirs[i]["error"]
                                  << ") but we rendered\n"
                                  << v.dump();
      continue;
    }
    EXPECT_EQ(error, "") << name << " case " << i << "\n" << v.dump();
    EXPECT_EQ(ours, theirs[i]["rendered"].get<std::string>()) << name << " case " << i << "\n" << v.dump();
    ++rendered;
  }
  EXPECT_GT(rendered, 100);
}

TEST(JinjaOracle, Qwen35TemplateAgreesWithHuggingFaceJinjaJs) {
  compare_with_oracle("qwen3_5", testing::read_text("tests/fixtures/chat-templates/qwen3_5.jinja"), true);
}

TEST(JinjaOracle, Qwen3TemplateAgreesWithHuggingFaceJinjaJs) {
  testing::qwen3_tokenizer_path();
  auto config =
      ordered_json::parse(testing::read_text(std::string(testing::kQwen3Dir) + "/tokenizer_config.json"));
  compare_with_oracle("qwen3", config["chat_template"].get<std::string>(), false);
}

}  // namespace
}  // namespace moeserve::text
