// Structured output against a real JSON Schema validator: ajv 8 with ajv-formats (tests/engine/js), on
// schemas that zod 4 writes, that pydantic writes, and random ones. Both directions of "exact": the matcher
// accepts a document exactly when ajv says it is valid (documents as JSON.stringify writes them, the spelling
// the matcher promises to take), and every document the matcher lets a random walk complete is valid.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "engine/json_constraint.h"
#include "run_process.h"

namespace moeserve {
namespace {

using json = nlohmann::json;

int shell(const std::string& command, std::string* output) {
  peers::CommandResult r = peers::run_command(command);
  *output += r.output;
  return r.status;
}

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

bool matches(const std::shared_ptr<const JsonSchema>& s, std::string_view text) {
  JsonMatcher m(s);
  return m.advance(text) && m.can_end();
}

// Characters of the schema's patterns and of samples of its formats: a walk that leans on them ends a
// pattern such as "ab+c" (matched anywhere) in a few hundred steps rather than never.
std::string hints(const json& schema) {
  std::string out;
  if (schema.is_object()) {
    if (auto p = schema.find("pattern"); p != schema.end() && p->is_string()) out += p->get<std::string>();
    if (auto p = schema.find("properties"); p != schema.end() && p->is_object())
      for (const auto& [name, value] : p->items()) out += json(name).dump();
    if (schema.contains("format"))
      out +=
          "ann.lee@example.com 2024-02-29T10:20:30Z https://x.org/a?b#c 123e4567-e89b-12d3-a456-426614174000";
  }
  if (schema.is_structured())
    for (const json& v : schema) out += hints(v);
  return out;
}

// A document the matcher writes itself: random bytes among those it accepts, leaning towards the schema's
// hints and closing bytes after a while so that the walk ends. nullopt at a dead end (neither a byte nor the
// end: a bug), "" when the walk did not end in time (the walk's luck, counted).
std::optional<std::string> walk(const std::shared_ptr<const JsonSchema>& s, const std::string& hint,
                                std::mt19937& rng) {
  std::string alphabet;
  for (int c = 0x20; c < 0x7F; ++c) alphabet.push_back(char(c));
  alphabet += "\n\xC3\xA9";
  JsonMatcher m(s);
  std::string doc;
  for (int step = 0; step < 4000; ++step) {
    if (m.can_end() && (step > 200 || rng() % 16 == 0)) return doc;
    std::string next;
    for (char c : alphabet)
      if (m.accepts(std::string_view(&c, 1))) next.push_back(c);
    if (next.empty()) return m.can_end() ? std::optional(doc) : std::nullopt;
    std::string closing;
    for (char c : next)
      if (hint.find(c) != std::string::npos ||
          std::string_view("\"}]0123456789").find(c) != std::string_view::npos)
        closing.push_back(c);
    const std::string& from = step > 200 && !closing.empty() && rng() % 4 ? closing : next;
    const char c = from[rng() % from.size()];
    EXPECT_TRUE(m.advance(std::string_view(&c, 1)));
    doc.push_back(c);
  }
  return m.can_end() ? doc : std::string();
}

TEST(SchemaDifferential, AgreesWithAjvAndEveryCompletedDocumentIsValid) {
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0)
      << "node is missing: run scripts/install-deps.sh";
  ASSERT_TRUE(std::filesystem::exists("tests/engine/js/node_modules/ajv/package.json"))
      << "ajv is missing: run tests/engine/js/install.sh (scripts/fetch-test-data.sh does)";
  const auto dir = std::filesystem::temp_directory_path() / ("moeserve-schema-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string out;
  ASSERT_EQ(shell("node tests/engine/js/schema_oracle.mjs cases 1 " + (dir / "cases.json").string(), &out), 0)
      << out;
  const json cases = read_json(dir / "cases.json");

  std::vector<std::shared_ptr<const JsonSchema>> schemas;
  for (const json& s : cases["schemas"]) {
    try {
      schemas.push_back(JsonSchema::compile(s));
    } catch (const SchemaError& e) {
      ADD_FAILURE() << e.what() << "\n" << s.dump();
      schemas.push_back(nullptr);
    }
  }
  ASSERT_GE(schemas.size(), 300u);

  // Direction 1: ajv's verdict on every document.
  size_t valid = 0, disagree = 0;
  for (const json& d : cases["docs"]) {
    const auto& schema = schemas[d[0].get<size_t>()];
    if (!schema) continue;
    const std::string text = d[1].get<std::string>();
    const bool ajv = d[2].get<bool>();
    valid += ajv;
    if (matches(schema, text) != ajv && ++disagree <= 20)
      ADD_FAILURE() << "ajv says " << (ajv ? "valid" : "invalid") << ": " << text << "\nschema "
                    << cases["schemas"][d[0].get<size_t>()].dump();
  }
  EXPECT_EQ(disagree, 0u);
  EXPECT_GT(valid, 2000u);
  EXPECT_GT(cases["docs"].size() - valid, 2000u);

  // Direction 2: what the matcher completes, ajv accepts.
  std::mt19937 rng(3);
  json judge = {{"schemas", cases["schemas"]}, {"docs", json::array()}};
  size_t past_double = 0, unfinished = 0, walks = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    if (!schemas[i]) continue;
    const std::string hint = hints(cases["schemas"][i]);
    for (int k = 0; k < 2; ++k) {
      const std::optional<std::string> walked = walk(schemas[i], hint, rng);
      ASSERT_TRUE(walked) << "a dead end, schema " << cases["schemas"][i].dump();
      const std::string& doc = *walked;
      if (doc.empty()) {
        ++unfinished;
        continue;
      }
      ++walks;
      try {
        [[maybe_unused]] const json parsed = json::parse(doc);
      } catch (const json::out_of_range&) {
        ++past_double;  // JSON, with a number past a double (1e999): JavaScript reads Infinity, not
                        // comparable
        continue;
      } catch (const json::parse_error& e) {
        FAIL() << "not JSON: " << doc << ": " << e.what();
      }
      judge["docs"].push_back({i, doc});
    }
  }
  EXPECT_LT(past_double, 20u);
  EXPECT_LT(unfinished, 30u);  // of 600 walks
  EXPECT_GT(walks, 550u);
  std::ofstream(dir / "walks.json") << judge.dump();
  out.clear();
  ASSERT_EQ(shell("node tests/engine/js/schema_oracle.mjs judge " + (dir / "walks.json").string() + " " +
                      (dir / "verdicts.json").string(),
                  &out),
            0)
      << out;
  const json verdicts = read_json(dir / "verdicts.json");
  size_t invalid = 0;
  for (size_t k = 0; k < verdicts.size(); ++k)
    if (!verdicts[k].get<bool>() && ++invalid <= 20)
      ADD_FAILURE() << "the matcher completed a document ajv refuses: "
                    << judge["docs"][k][1].get<std::string>() << "\nschema "
                    << cases["schemas"][judge["docs"][k][0].get<size_t>()].dump();
  EXPECT_EQ(invalid, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve
