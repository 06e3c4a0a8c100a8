// moeserve tokenize: encode text (or decode ids) with a tokenizer.json, as the server would.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "common/error.h"
#include "text/tokenizer.h"

namespace {

struct TokenizeFlags {
  std::string tokenizer, text, file, decode;
  bool no_special = false;
  bool skip_special = false;
};

std::string tokenizer_json_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return (fs::path(path) / "tokenizer.json").string();
  return path;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cleaned = s;
  for (char& c : cleaned)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream in(cleaned);
  std::string word;
  while (in >> word) {
    try {
      size_t used = 0;
      long v = std::stol(word, &used);
      moeserve::check(used == word.size(), "--decode: '{}' is not an integer id", word);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::logic_error&) {
      moeserve::fail("--decode: '{}' is not an integer id", word);
    }
  }
  return ids;
}

int run(const TokenizeFlags& f) {
  using moeserve::text::Tokenizer;
  Tokenizer tok = Tokenizer::from_file(tokenizer_json_path(f.tokenizer));
  if (!f.decode.empty()) {
    std::string text = tok.decode(parse_ids(f.decode), f.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  std::string text = f.text;
  if (!f.file.empty()) {
    std::ifstream in(f.file, std::ios::binary);
    moeserve::check(in.good(), "cannot open --file '{}'", f.file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  nlohmann::json out = {{"ids", tok.encode(text, !f.no_special)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();
  app.add_option("--tokenizer", flags->tokenizer, "tokenizer.json, or a model directory holding one")
      ->required();
  auto* text = app.add_option("--text", flags->text, "text to encode");
  auto* file = app.add_option("--file", flags->file, "file whose bytes to encode");
  auto* decode =
      app.add_option("--decode", flags->decode, "decode these ids instead (e.g. \"9707,11,1879\")");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  app.add_flag("--no-special", flags->no_special,
               "do not apply the post-processor's special tokens (e.g. BOS)");
  app.add_flag("--skip-special", flags->skip_special, "with --decode: leave out special tokens");
  return [flags] { return run(*flags); };
}

moeserve::app::Registration reg{
    {"tokenize", "Encode text to token ids (or decode ids) with a tokenizer.json", 80, setup}};

}  // namespace
