// What the JSON constraint costs the sampler per token: sample() over a Qwen3-sized row (151,936 logits),
// free vs under response_format json_object, greedy and temperature 1, with logits that look like a random
// model's (nearly flat: the worst case, most draws are rejected at structural positions) or a trained one's
// (peaked on a few tokens). Token table: the Qwen3 tokenizer in .cache/ (scripts/fetch-test-data.sh).
//
// And what a step costs under a json_schema with a large enum, at 10, 1,000 and 100,000 values (seeded
// random lowercase words of 4 to 12 letters; 100,000 of them are within the default limits), the text so far
// being `{"k": "` (every value still possible): BM_EnumVocabMask checks every token of the vocabulary against
// the matcher (what the sampler does when it scans a whole row: the worst case of a step; `work_per_token`
// is JsonMatcher::work() per check), BM_EnumSampleToken is sample() at temperature 1 over a nearly flat row
// (rejections, then a scan of the whole cut), BM_EnumCompile the schema's compilation (once per request).
// Run from the source root: build/bench/bench_sampler
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>

#include "engine/json_constraint.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"

namespace moeserve {
namespace {

constexpr int64_t kVocab = 151936;
constexpr int32_t kEos = 151645;  // <|im_end|>

std::shared_ptr<const TokenBytes> table() {
  static const auto t = [] {
    const auto tok = text::Tokenizer::from_file(".cache/tokenizer-qwen3/tokenizer.json");
    auto t = std::make_shared<TokenBytes>();
    const size_t n = std::min<size_t>(tok.vocab_size(), kVocab);
    t->bytes.resize(n);
    t->usable.resize(n);
    for (size_t id = 0; id < n; ++id) {
      t->bytes[id] = tok.token_bytes(int32_t(id));
      t->usable[id] = !t->bytes[id].empty() && !tok.is_added(int32_t(id));
    }
    return std::shared_ptr<const TokenBytes>(std::move(t));
  }();
  return t;
}

// Eight rows to cycle through; peaked rows put most of the mass on a handful of random tokens.
std::vector<std::vector<float>> rows(bool peaked) {
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0, peaked ? 2.0f : 0.05f);
  std::vector<std::vector<float>> out(8, std::vector<float>(kVocab));
  for (auto& r : out) {
    for (float& l : r) l = noise(rng);
    if (peaked)
      for (int i = 0; i < 8; ++i) r[std::uniform_int_distribution<int>(0, kVocab - 1)(rng)] += 12.0f;
  }
  return out;
}

// Args: constrained (0/1), temperature x 10, peaked (0/1).
void BM_SampleToken(benchmark::State& state) {
  const bool constrained = state.range(0) != 0;
  SamplingParams p;
  p.temperature = float(state.range(1)) / 10.0f;
  if (constrained) {
    auto c = std::make_shared<JsonConstraint>();
    c->schema = JsonSchema::any_object();
    c->vocab = table();
    p.json = c;
  }
  const auto logits = rows(state.range(2) != 0);
  const std::vector<int32_t> prompt = {1};
  auto fresh = [&] {
    auto s = std::make_unique<Sampler>(p, prompt, 7);
    s->constrain({kEos});
    return s;
  };
  auto sampler = fresh();
  size_t step = 0, tokens = 0;
  for (auto _ : state) {
    const int32_t t = sampler->sample(logits[step++ % logits.size()], {});
    ++tokens;
    if (t == kEos || t == kNoToken || tokens % 256 == 0) sampler = fresh();  // a new document now and then
  }
  state.SetItemsProcessed(int64_t(tokens));
}
BENCHMARK(BM_SampleToken)
    ->ArgNames({"json", "temp_x10", "peaked"})
    ->ArgsProduct({{0, 1}, {0, 10}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

nlohmann::json enum_schema(int64_t values) {
  std::mt19937 rng(3);
  nlohmann::json e = nlohmann::json::array();
  for (int64_t i = 0; i < values; ++i) {
    std::string word(4 + rng() % 9, 'a');
    for (char& c : word) c = char('a' + rng() % 26);
    e.push_back(word);
  }
  return {{"type", "object"}, {"properties", {{"k", {{"enum", e}}}}}, {"required", {"k"}}};
}

void BM_EnumCompile(benchmark::State& state) {
  const nlohmann::json schema = enum_schema(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(JsonSchema::compile(schema));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// accepts() over the whole `vocab` once the matcher has taken `prefix`: the mask a constrained step
// computes.
void time_vocab_mask(benchmark::State& state, const std::shared_ptr<const TokenBytes>& vocab,
                     std::shared_ptr<const JsonSchema> schema, std::string_view prefix) {
  JsonMatcher m(std::move(schema));
  if (!m.advance(prefix)) state.SkipWithError("the prefix is not accepted");
  size_t allowed = 0;
  const uint64_t work = m.work();
  for (auto _ : state) {
    allowed = 0;
    for (size_t id = 0; id < vocab->bytes.size(); ++id)
      allowed += vocab->usable[id] && m.accepts(vocab->bytes[id]);
    benchmark::DoNotOptimize(allowed);
  }
  state.counters["allowed"] = double(allowed);
  state.counters["work_per_token"] =
      double(m.work() - work) / double(state.iterations()) / double(vocab->bytes.size());
  state.SetItemsProcessed(state.iterations() * int64_t(vocab->bytes.size()));
}

void BM_EnumVocabMask(benchmark::State& state) {
  time_vocab_mask(state, table(), JsonSchema::compile(enum_schema(state.range(0))), "{\"k\": \"");
}

void BM_EnumSampleToken(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 1.0f;
  auto c = std::make_shared<JsonConstraint>();
  c->schema = JsonSchema::compile(enum_schema(state.range(0)));
  c->vocab = table();
  p.json = c;
  const std::vector<float> row = rows(false)[0];
  const std::vector<int32_t> prompt = {1};
  // Each step starts from `{"k": "` so that every value is still possible.
  std::vector<int32_t> prefix;
  for (std::string_view piece : {"{\"", "k", "\":", " \""})
    prefix.push_back(
        int32_t(std::find(c->vocab->bytes.begin(), c->vocab->bytes.end(), piece) - c->vocab->bytes.begin()));
  for (auto _ : state) {
    state.PauseTiming();
    Sampler s(p, prompt, 7);
    s.constrain({kEos});
    for (int32_t t : prefix) s.accept(t);
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.sample(row, {}));
  }
}

BENCHMARK(BM_EnumCompile)->ArgName("values")->Arg(10)->Arg(1000)->Arg(100000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EnumVocabMask)
    ->ArgName("values")
    ->Arg(10)
    ->Arg(1000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EnumSampleToken)
    ->ArgName("values")
    ->Arg(10)
    ->Arg(1000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond);

// The constraints of zod's and pydantic's schemas at Qwen3.5's vocabulary (248,320 ids: the Qwen3 table's
// tokens repeated past its end, since a check costs what its bytes cost): a number under bounds and a string
// under a pattern + format, against the same positions without them (what the schema was before bounds and
// patterns were supported: the unbounded field). The text so far ends where the field's value starts
// (numbers: `{"v": `) or inside it (strings: `{"v": "ann.lee`).
constexpr size_t kQwen35Vocab = 248320;

std::shared_ptr<const TokenBytes> big_table() {
  static const auto t = [] {
    const auto base = table();
    auto t = std::make_shared<TokenBytes>();
    for (size_t id = 0; id < kQwen35Vocab; ++id) {
      t->bytes.push_back(base->bytes[id % base->bytes.size()]);
      t->usable.push_back(base->usable[id % base->bytes.size()]);
    }
    return std::shared_ptr<const TokenBytes>(std::move(t));
  }();
  return t;
}

struct Field {
  const char* value_schema;
  const char* text;
};
// Arg: 0 number, 1 integer with zod's safe-integer bounds, 2 string, 3 string with zod's email pattern and
// format, 4 number in (0, 1] (bounds that refuse most number tokens: each is decided on its digits), 5 a
// string inside a union of two objects (pydantic's Union[A, B]: two states followed, against field 2's one),
// 6 an integer with multipleOf and bounds, 7 zod's price (a decimal step, 0.01, and bounds: each number token
// is decided on its digits and decimals), 8 an integer under an allOf of a type and a bound (merged into one
// node at compile time: field 1's cost).
const Field kFields[] = {
    {R"({"type": "number"})", R"({"v": )"},
    {R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})", R"({"v": )"},
    {R"({"type": "string"})", R"({"v": "ann.lee)"},
    {R"({"type": "string", "format": "email", "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
     R"({"v": "ann.lee)"},
    {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})", R"({"v": )"},
    {R"({"anyOf": [{"type": "object", "properties": {"name": {"type": "string"}, "lives": {"type": "integer"}},
                    "required": ["name"]},
                   {"type": "object", "properties": {"name": {"type": "string"}, "good": {"type": "boolean"}},
                    "required": ["name"]}]})",
     R"({"v": {"name": "ann.lee)"},
    {R"({"type": "integer", "multipleOf": 7, "minimum": -1000, "maximum": 100000})", R"({"v": )"},
    {R"({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 10000})", R"({"v": )"},
    {R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9007199254740991}]})", R"({"v": )"},
};

std::shared_ptr<const JsonSchema> field_schema(int64_t kind) {
  const nlohmann::json value = nlohmann::json::parse(kFields[kind].value_schema);
  return JsonSchema::compile({{"type", "object"}, {"properties", {{"v", value}}}, {"required", {"v"}}});
}

// sample() at temperature 1 over a nearly flat 248,320-logit row, once the sampler has taken `prefix` (as
// single-byte tokens: each is in the Qwen3 table).
void time_sample_token(benchmark::State& state, std::shared_ptr<const JsonSchema> schema,
                       std::string_view prefix) {
  SamplingParams p;
  p.temperature = 1.0f;
  auto c = std::make_shared<JsonConstraint>();
  c->schema = std::move(schema);
  c->vocab = big_table();
  p.json = c;
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0, 0.05f);
  std::vector<float> row(kQwen35Vocab);
  for (float& l : row) l = noise(rng);
  const std::vector<int32_t> prompt = {1};
  std::vector<int32_t> prefix_ids;
  for (char ch : prefix)
    prefix_ids.push_back(
        int32_t(std::find(c->vocab->bytes.begin(), c->vocab->bytes.end(), std::string(1, ch)) -
                c->vocab->bytes.begin()));
  for (auto _ : state) {
    state.PauseTiming();
    Sampler s(p, prompt, 7);
    s.constrain({kEos});
    for (int32_t t : prefix_ids) s.accept(t);
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.sample(row, {}));
  }
}

void BM_FieldVocabMask(benchmark::State& state) {
  time_vocab_mask(state, big_table(), field_schema(state.range(0)), kFields[state.range(0)].text);
}
BENCHMARK(BM_FieldVocabMask)->ArgName("field")->DenseRange(0, 8)->Unit(benchmark::kMillisecond);

// From the field's prefix.
void BM_FieldSampleToken(benchmark::State& state) {
  time_sample_token(state, field_schema(state.range(0)), kFields[state.range(0)].text);
}
BENCHMARK(BM_FieldSampleToken)->ArgName("field")->DenseRange(0, 8)->Unit(benchmark::kMillisecond);

// A forced tool call in Qwen3.5's XML format (qwen3_coder) at the same vocabulary: the positions of a call's
// text after its opening `<tool_call>\n<function=`, with "required" over two tools (the name still to
// choose). Arg: 0 the function name, 1 inside a raw string parameter, 2 between parameters (the next name or
// </function>), 3 an integer parameter in [1, 14], 4 a string parameter under a pattern.
const char* const kCallTexts[] = {
    "",
    "forecast>\n<parameter=city>\nPar",
    "forecast>\n<parameter=city>\nParis\n</parameter>\n",
    "forecast>\n<parameter=days>\n",
    "forecast>\n<parameter=zip>\n12",
};

std::shared_ptr<const JsonSchema> call_schema() {
  const auto parameters = nlohmann::json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "zip": {"type": "string", "pattern": "^\\d{5}$"}},
      "required": ["city"]})");
  return JsonSchema::tool_call({{"forecast", parameters}, {"lookup", {{"type", "object"}}}},
                               JsonSchema::CallFormat::kQwenXml, false);
}

void BM_CallVocabMask(benchmark::State& state) {
  time_vocab_mask(state, big_table(), call_schema(), kCallTexts[state.range(0)]);
}
BENCHMARK(BM_CallVocabMask)->ArgName("at")->DenseRange(0, 4)->Unit(benchmark::kMillisecond);

// At those positions.
void BM_CallSampleToken(benchmark::State& state) {
  time_sample_token(state, call_schema(), kCallTexts[state.range(0)]);
}
BENCHMARK(BM_CallSampleToken)->ArgName("at")->DenseRange(0, 4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moeserve

BENCHMARK_MAIN();
