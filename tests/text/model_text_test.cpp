#include "text/model_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "test_util.h"

namespace moeserve::text {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(ModelText, LoadsQwen3DirectoryWithTemplateAndSpecialTokens) {
  testing::qwen3_tokenizer_path();  // fails with a hint when the fixture is missing
  ModelText m = ModelText::load(testing::kQwen3Dir);
  EXPECT_EQ(m.eos_token, "<|im_end|>");
  EXPECT_EQ(m.eos_id, 151645);
  EXPECT_EQ(m.pad_token, "<|endoftext|>");
  EXPECT_EQ(m.pad_id, 151643);
  EXPECT_FALSE(m.bos_id.has_value());
  EXPECT_THAT(m.chat_template, ::testing::HasSubstr("<|im_start|>"));
  EXPECT_EQ(m.stop_ids, std::vector<int32_t>{151645});
}

TEST(ModelText, ChatTemplateJinjaWinsAndGenerationConfigAddsStopIds) {
  fs::path dir = fs::temp_directory_path() / ("moeserve-model-text-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(testing::qwen3_tokenizer_path(), dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  write(dir / "tokenizer_config.json",
        R"({"eos_token": {"content": "<|im_end|>"}, "chat_template": [{"name": "default", "template": "A"},
            {"name": "tool_use", "template": "B"}]})");
  write(dir / "generation_config.json", R"({"eos_token_id": [151643, 151645]})");
  ModelText m = ModelText::load(dir.string());
  EXPECT_EQ(m.chat_template, "A");
  EXPECT_EQ(m.named_templates.at("tool_use"), "B");
  EXPECT_EQ(m.stop_ids, (std::vector<int32_t>{151643, 151645}));
  write(dir / "chat_template.jinja", "C");
  EXPECT_EQ(ModelText::load(dir.string()).chat_template, "C");
  write(dir / "generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_THROW(ModelText::load(dir.string()), Error);
  fs::remove_all(dir);
}

TEST(ModelText, MissingTokenizerIsAClearError) {
  try {
    ModelText::load("/nonexistent-dir");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("has no tokenizer.json"));
  }
}

}  // namespace
}  // namespace moeserve::text
